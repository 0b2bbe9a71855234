"""The door to the web: a run's HTTP forward proxy on a Unix socket in its channel folder.

The container has no network; its loopback forwarder hands this door each client connection's bytes. The door
reads one bounded request head (CONNECT host:port, or an absolute http:// URI), checks what was asked for
against the run's rules, resolves names on the host, connects only to an address it checked, and pipes the
bytes both ways untouched, counting them against the run's budget. Every attempt is reported as an event.
"""
