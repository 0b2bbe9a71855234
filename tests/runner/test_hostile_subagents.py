"""Hostile subagents in real containers (1/2): planted files, nested spawns, and asking the proxy for more.

Each attack is a run whose container does its worst through the shell tool and the run socket, on a real
bot (real engine and image, real SQLite, fake Telegram and LLM at the edge; network `none`). Each test then
checks what the sandbox promises: no host file changed, nothing secret reachable by the chat's next run, the
bot answering another chat meanwhile, the run's outcome recorded once, nothing sent beyond the budgets.
The budget attacks are in test_hostile_budgets.py.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from runner.channel.llm_policy import CHAT_COMPLETIONS_PATH
from tests.harness import GROUP_ID
from tests.runner.hostile_host_files import LLM_KEY
from tests.runner.hostile_rig import MAX_TOKENS, SUBAGENT_MODEL, World, hostile_world, new_id
from tests.runner.hostile_scripts import container_python, reports

pytestmark = [pytest.mark.docker, pytest.mark.asyncio(loop_scope="module")]

PLANT_CHAT = GROUP_ID - 901
SPAWN_CHAT = GROUP_ID - 902
MODEL_CHAT = GROUP_ID - 903
OTHER_CHAT = GROUP_ID - 904  # a chat a nested spawn request would speak for

HOST_NAMES = [
    "task.json",
    "result.json",
    "session_in.json",
    "session_out.json",
    "container.log",
    "run.sock",
    "llm.sock",
    ".env",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory, subagent_image: str) -> AsyncIterator[World]:
    async with hostile_world(tmp_path_factory.mktemp("hostile"), [PLANT_CHAT, SPAWN_CHAT, MODEL_CHAT, OTHER_CHAT]) as w:
        yield w


# Every kind of entry that turns a host's open/copy/chmod-by-name into something else, under every name the
# host uses, in every folder the container can write (found by trying: the workspace, bind-mounted from the
# host, and its own scratch space), with links aimed at the host's own files; then every way of writing into
# the read-only channel folder.
PLANT = r"""
run_id, folder = ARGS["run_id"], ARGS["folder"]
env, canary, data_dir = ARGS["env"], ARGS["canary"], ARGS["data_dir"]


def writable(directory):
    try:
        with open(os.path.join(directory, ".probe-" + run_id), "w"):
            pass
        os.unlink(os.path.join(directory, ".probe-" + run_id))
        return True
    except OSError:
        return False


# Every folder the container can write, found rather than assumed: the tops of the writable trees.
tops = []
for root, dirs, _files in os.walk("/"):
    if root in ("/proc", "/sys") or any(root.startswith(top + "/") for top in tops):
        dirs[:] = []
        continue
    if writable(root):
        tops.append(root)
        dirs[:] = []
report("writable", sorted(tops))
tops = [top for top in tops if top != "/dev/mqueue"]  # message queues only: no links, FIFOs or files there
folders = []
for top in tops:  # each top, and in it the host's own folder names
    folders += [top, top + "/runs/" + run_id, top + "/channels/" + run_id, top + "/sessions/" + folder,
                top + "/ipc/" + folder + "/tasks"]
sources = {}
for top in tops:
    sources[top] = top + "/hardlink-source"
    with open(sources[top], "w") as handle:
        handle.write("planted")


def bind(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()  # the socket file stays


def sparse(path):
    with open(path, "wb") as handle:
        handle.truncate(64 << 30)


kinds = {
    "link-env": lambda path, name: os.symlink(env, path),
    "link-canary": lambda path, name: os.symlink(canary, path),
    "link-run-dir": lambda path, name: os.symlink(data_dir + "/runs/" + run_id + "/" + name, path),
    "link-data-dir": lambda path, name: os.symlink(data_dir, path),
    "link-device": lambda path, name: os.symlink("/dev/zero", path),
    "hardlink": lambda path, name: os.link(next(v for k, v in sources.items() if path.startswith(k + "/")), path),
    "fifo": lambda path, name: os.mkfifo(path),
    "socket": lambda path, name: bind(path),
    "sparse": lambda path, name: sparse(path),
}
planted, failed = 0, []
for f_index, top in enumerate(folders):
    os.makedirs(top, exist_ok=True)
    for k_index, (kind, plant) in enumerate(kinds.items()):
        os.makedirs(top + "/" + kind, exist_ok=True)
        for n_index, name in enumerate(ARGS["names"]):
            # Each kind under every name in its own folder, and a mix of kinds under the names at the top.
            targets = [top + "/" + kind + "/" + name]
            if (f_index + n_index) % len(kinds) == k_index:
                targets.append(top + "/" + name)
            for path in targets:
                try:
                    plant(path, name)
                    planted += 1
                except OSError as exc:
                    failed.append(path + ": " + type(exc).__name__)
report("planted", {"count": planted, "failed": failed})

channel_writes = []
attempts = 0
for name in ARGS["names"] + ["tasks", "x"]:
    path = "/crewbot/channel/" + name
    for action in (lambda: os.symlink("/dev/zero", path), lambda: os.mkfifo(path), lambda: open(path, "w").close(),
                   lambda: bind(path), lambda: os.mkdir(path), lambda: os.link(sources["/tmp"], path)):
        attempts += 1
        try:
            action()
            channel_writes.append(path)
        except OSError:
            pass
for action in (lambda: os.unlink(SOCKET), lambda: os.chmod(SOCKET, 0o777), lambda: os.rename(SOCKET, SOCKET + ".x"),
               lambda: os.chmod("/crewbot/channel", 0o777)):
    attempts += 1
    try:
        action()
        channel_writes.append("run.sock")
    except OSError:
        pass
report("channel", {"attempts": attempts, "succeeded": channel_writes})
"""


async def test_planted_links_fifos_sockets_and_giant_files_never_reach_the_host(world: World) -> None:
    chat = await world.chat(PLANT_CHAT)
    data_dir = world.settings.data_dir.resolve()
    env = data_dir.parent / ".env"
    key = new_id("hold")
    # The run id is the request's: known before the run starts, so the links can aim at its own run dir.
    run_id = new_id("plant")
    plant = container_python(
        PLANT,
        run_id=run_id,
        folder=chat.folder,
        env=str(env),
        canary=str(data_dir / "canary.txt"),
        data_dir=str(data_dir),
        names=HOST_NAMES,
    )
    await world.spawn(chat, f"hold: {key}\n{plant}", "plant", run_id=run_id)

    await world.script.wait_held(key)
    await world.bystander_answers(while_running=run_id)
    world.script.release(key)
    record = await world.wait_final(run_id)

    assert record.status == "completed", record.error
    facts = reports(record.result)
    # The workspace and the container's own scratch space: a writable run dir, IPC folder or channel shows here.
    scratch = {"/tmp", "/dev/shm", "/dev/mqueue"}
    assert "/workspace" in facts["writable"] and set(facts["writable"]) <= {"/workspace", *scratch}, facts
    planted, folders = facts["planted"], len(set(facts["writable"]) - {"/dev/mqueue"}) * 5
    assert planted["failed"] == [] and planted["count"] >= folders * 9 * len(HOST_NAMES), planted
    assert facts["channel"]["attempts"] > 40 and facts["channel"]["succeeded"] == [], facts["channel"]
    # The host's side of the run: regular files it wrote itself, each with one link, nothing of the container's.
    run_dir = data_dir / "runs" / run_id
    entries = {entry.name: entry.stat(follow_symlinks=False) for entry in os.scandir(run_dir)}
    assert set(entries) <= {"task.json", "container.log"} and "task.json" in entries, sorted(entries)
    assert all(stat.S_ISREG(st.st_mode) and st.st_nlink == 1 for st in entries.values()), entries
    assert not (data_dir / "channels" / run_id).exists()
    await world.assert_one_outcome(chat, record)
    world.assert_host_untouched()

    # Retention walks what runs left on disk: it copes with this chat's leftovers and removes nothing it must keep.
    pruned = await world.service.retention.prune()
    assert pruned.failures == 0 and pruned.run_dirs == 0, pruned
    # The quota check walks the workspace (FIFOs, sockets, 64 GiB sparse files, links) before the next run starts.
    await world.assert_no_secret_for_next_run(chat)
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()


# The container looks for any way to start a run of its own: an IPC folder, a spawn route on its socket, and a
# spawn request written wherever it can write, for its own chat and for another.
NESTED = r"""
found = []
for root, dirs, _files in os.walk("/"):
    if root in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    found += [os.path.join(root, d) for d in dirs if d == "ipc"]
report("ipc_dirs", {"crewbot_ipc": os.path.exists("/crewbot/ipc"), "crewbot": sorted(os.listdir("/crewbot")),
                    "found": found})
statuses = {}
for request in ARGS["requests"]:
    for path in ("/run/spawn", "/run/spawn_subagent", "/ipc/tasks", "/run/../ipc/tasks", "/v1/spawn"):
        statuses["POST " + path] = call("POST", path, request)[0]
        statuses["GET " + path] = call("GET", path)[0]
report("routes", statuses)
written, refused = [], []
for request, folder in zip(ARGS["requests"], ARGS["folders"]):
    name = request["request_id"] + ".json"
    for directory in ("/workspace", "/workspace/tasks", "/workspace/ipc/" + folder + "/tasks", "/tmp/tasks", "/dev/shm",
                      "/crewbot/ipc/" + folder + "/tasks", "/crewbot/channel/tasks", "/crewbot/channel",
                      "/ipc/" + folder + "/tasks"):
        path = directory + "/" + name
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "w") as handle:
                json.dump(request, handle)
            written.append(path)
        except OSError:
            refused.append(path)
report("spawn_files", {"written": len(written), "refused": refused})
"""


async def test_a_subagent_cannot_start_a_subagent(world: World) -> None:
    chat = await world.chat(SPAWN_CHAT)
    other = await world.chat(OTHER_CHAT)
    nested_ids = [new_id("nested"), new_id("nested")]
    requests = [
        {"version": 1, "request_id": nested_ids[0], "task": "$ echo nested", "chat_id": SPAWN_CHAT},
        {"version": 1, "request_id": nested_ids[1], "task": "$ echo nested", "chat_id": OTHER_CHAT},
    ]
    key = new_id("hold")
    task = f"hold: {key}\n{container_python(NESTED, requests=requests, folders=[chat.folder, other.folder])}"
    run_id = await world.spawn(chat, task, "nested")

    await world.script.wait_held(key)
    await world.bystander_answers(while_running=run_id)
    world.script.release(key)
    record = await world.wait_final(run_id)

    assert record.status == "completed", record.error
    facts = reports(record.result)
    assert facts["ipc_dirs"] == {"crewbot_ipc": False, "crewbot": ["channel"], "found": []}, facts["ipc_dirs"]
    # No such route: 404, or for a body the host does not read a hang-up (status 0) before the body is sent.
    routes = facts["routes"]
    assert {s for r, s in routes.items() if r.startswith("GET ")} == {404}, routes
    assert {s for r, s in routes.items() if r.startswith("POST ")} <= {404, 0}, routes
    assert facts["spawn_files"]["written"] >= 2 * 5  # written where it may: its workspace and scratch space
    assert all(p.startswith(("/crewbot/", "/ipc/")) for p in facts["spawn_files"]["refused"])
    await world.assert_one_outcome(chat, record)
    await world.assert_no_secret_for_next_run(chat)  # several IPC rescans later

    for nested in nested_ids:
        assert not await world.runs.exists(nested)
    assert {r.label for r in await world.runs.for_chat(SPAWN_CHAT, 100)} == {"nested", "probe"}
    assert await world.runs.for_chat(OTHER_CHAT, 100) == []
    # Nothing reached the IPC folders either: not as a request, not quarantined as a bad one.
    assert [p for p in world.ipc_root.rglob("*") if not p.is_dir()] == []
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()


# The container calls the LLM itself, asking for everything the policy takes away.
GREEDY = r"""
body = {
    "model": "gpt-expensive",
    "n": 5,
    "max_tokens": 10000000,
    "messages": [{"role": "user", "content": ARGS["marker"]}],
    "tools": [
        {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}},
        {"type": "web_search"},
        {"type": "web_search_preview"},
        {"type": "code_interpreter"},
    ],
    "web_search_options": {"search_context_size": "high"},
    "service_tier": "priority",
    "store": True,
}
headers = {"openai-beta": "assistants=v2", "Authorization": "Bearer sk-stolen-or-forged"}
status, answer = call("POST", "/v1/chat/completions", body, headers)
responses_status, responses_answer = call("POST", "/v1/responses", body, headers)
try:
    says = json.loads(responses_answer)["error"]["message"][:60]
except (ValueError, KeyError, TypeError):
    says = responses_answer[:60].decode(errors="replace")
report("greedy", {"chat": status, "responses": responses_status, "responses_says": says})
"""


async def test_a_request_for_another_model_and_provider_tools_is_pinned_and_stripped(world: World) -> None:
    chat = await world.chat(MODEL_CHAT)
    marker = new_id("greedy")
    key = new_id("hold")
    run_id = await world.spawn(chat, f"hold: {key}\n{container_python(GREEDY, marker=marker)}", "greedy")

    await world.script.wait_held(key)
    await world.bystander_answers(while_running=run_id)
    world.script.release(key)
    record = await world.wait_final(run_id)

    assert record.status == "completed", record.error
    facts = reports(record.result)["greedy"]
    assert facts["chat"] == 200 and facts["responses"] == 404, facts
    assert "is not served here" in facts["responses_says"]  # the proxy said so, not a provider behind it
    (forwarded,) = world.calls_of(marker)
    body, headers = forwarded.body, forwarded.headers
    assert forwarded.path == CHAT_COMPLETIONS_PATH
    assert body["model"] == SUBAGENT_MODEL
    assert "n" not in body and "web_search_options" not in body and "service_tier" not in body
    assert "store" not in body
    assert 1 <= body["max_tokens"] <= MAX_TOKENS and body.get("max_completion_tokens", 1) <= MAX_TOKENS
    assert [t["type"] for t in body["tools"]] == ["function"]
    assert "openai-beta" not in headers and headers["authorization"] == f"Bearer {LLM_KEY}"
    # Every request the run made, its agent's as much as its own, went to the pinned model.
    assert {r.body["model"] for r in world.llm.requests() if r.body and "messages" in r.body} == {SUBAGENT_MODEL}
    await world.assert_one_outcome(chat, record)
    await world.assert_no_secret_for_next_run(chat)
    await world.assert_within_budgets(chat)
    world.assert_host_untouched()
