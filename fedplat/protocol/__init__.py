"""The bottom of fedplat's service: what a client, a coordinator and a peer agree on.

Transport-neutral and free of fedplat's roles (the coordinator, the SDK, gossip,
the simulator, the monitor, the transports and protobuf): domain errors and their
codes (:mod:`~fedplat.protocol.errors`), the coordinator protocol's messages
(:mod:`~fedplat.protocol.messages`) and task contract
(:mod:`~fedplat.protocol.task`), an upload's payload (:mod:`~fedplat.protocol.body`)
and its one encode and decode path (:mod:`~fedplat.protocol.codec`), the gossip
peer protocol's messages and what their signatures cover
(:mod:`~fedplat.protocol.peer`), and the outcome states of a selected client in a
round (:mod:`~fedplat.protocol.outcomes`). ``tests/test_packaging.py`` keeps it at
the bottom of the import graph.
"""
