"""Performance kernels behind the rules (``fedplat.aggregators.kernels``).

Nothing here defines a rule: the rule modules state the maths and call these for
speed. :mod:`.bitonic` sorts column blocks with an eager comparator network,
:mod:`.fused_sort` compiles a network and a rule's per-column reduction into one
loop, :mod:`.order_stats` picks between them and counts kept entries, and
:mod:`.distances` computes Gram matrices and pairwise distances with a few large
GEMMs.
"""
