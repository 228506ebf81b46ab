"""The control API: operators run a coordinator over mutual TLS, by role, audited.

:mod:`fedplat.control.service` answers the calls (``fedplat/proto/control.proto``),
:mod:`fedplat.control.audit` says who may call what and records every call, and
:mod:`fedplat.control.client` is what the ``fedplat runs|devices|tokens|audit``
commands use to reach it. Operators' certificates and roles:
:mod:`fedplat.security.operators`. Nothing here imports the coordinator: the
composition root (:mod:`fedplat.server.app`) serves it beside a run.
"""
