"""Tools for testing fedplat deployments: a client that speaks the wire protocol by
hand (:mod:`fedplat.testing.protocol`; the gossip peers':
:mod:`fedplat.testing.peer`), so a test, a fuzzer or an attack benchmark can send
anything, valid or not. Not used by the product itself."""
