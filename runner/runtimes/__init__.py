"""Container runtimes: the ContainerRuntime protocol, the Docker runtime, resource use, and the subagent image."""
