"""Reproduce (and check the fix of) the piecewise-compile failure of TRIT_CHAIN=1's torch.cond routing.

    python ci/cond_split_repro.py [closure|args] [fix|nofix]

A two-layer toy model whose layers route between an opaque "chain" op and ordinary torch ops by a
torch.cond on the token count (as trit.vllm.bitnet.route_tokens does), with an opaque "attention" op in
front of each cond, traced by Dynamo with a dynamic token count and compiled the way vLLM compiles a
model: vLLM's own ``split_graph`` cuts the graph at the attention ops and each piece goes through
Inductor's compile_fx with the example inputs vLLM's ``get_fake_args_from_graph`` reads from the piece
(the placeholders up to its first other node). Where vLLM is not installed, torch's split_module and the
same placeholder rule stand in.

torch 2.11 (vLLM 0.26's torch): the pieces holding a cond have get_attr nodes among their placeholders,
the compile gets too few inputs and fails ("Expected positional argument for parameter ..."); with
``fix`` (trit.vllm.fx_compat: the cond predicate copied to each user before the split, each piece's
placeholders first after it - what trit.vllm.register() installs under TRIT_CHAIN=1) it compiles and the compiled model equals eager at 8, 1 and 3 tokens. torch 2.13:
both compile. Prints one line ``RESULT ok|FAILED <route> <fix> <torch version>``; exit status 0 on ok.
"""
import sys
import traceback
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from trit.vllm.fx_compat import localize_sym_predicates, placeholders_first  # noqa: E402

ROUTE = sys.argv[1] if len(sys.argv) > 1 else "args"
FIX = (sys.argv[2] if len(sys.argv) > 2 else "fix") == "fix"

lib = torch.library.Library("trit_repro", "DEF")
lib.define("attn(Tensor x) -> Tensor")
lib.define("chain(Tensor x, Tensor r, Tensor[] ws) -> (Tensor, Tensor)")


@torch.library.impl(lib, "attn", "CompositeExplicitAutograd")
def _attn(x):
    return x * 2


@torch.library.register_fake("trit_repro::attn")
def _attn_fake(x):
    return torch.empty_like(x)


@torch.library.impl(lib, "chain", "CompositeExplicitAutograd")
def _chain(x, r, ws):
    h = x + r
    y = h
    for w in ws:
        y = torch.relu(y @ w.t())
    return y, h


@torch.library.register_fake("trit_repro::chain")
def _chain_fake(x, r, ws):
    return torch.empty_like(x), torch.empty_like(x)


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.Parameter(torch.rand(d) + 0.5)
        self.o, self.g, self.dn = (nn.Parameter(torch.randn(d, d) / d) for _ in range(3))

    def many(self, x, r):
        h = x + r
        y = torch.relu((h * self.norm) @ self.o.t())
        return torch.relu(y @ self.g.t()) @ self.dn.t(), h

    def forward(self, x, r):
        x = torch.ops.trit_repro.attn(x)
        if ROUTE == "closure":
            def one(x, r):
                return tuple(torch.ops.trit_repro.chain(x, r, [self.o, self.g, self.dn]))
            return tuple(torch.cond(x.shape[0] == 1, one, self.many, (x, r)))

        def one_(x, r, o, g, dn):
            return tuple(torch.ops.trit_repro.chain(x, r, [o, g, dn]))

        def many_(x, r, o, g, dn):
            return self.many(x, r)

        return tuple(torch.cond(x.shape[0] == 1, one_, many_, (x, r, self.o, self.g, self.dn)))


class Model(nn.Module):
    def __init__(self, d=64, layers=2):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d) for _ in range(layers))

    def forward(self, x):
        r = torch.zeros_like(x)
        for layer in self.layers:
            x, r = layer(x, r)
        return x + r


def split(gm):
    """(split module, pieces): vLLM's split_graph at the attention op, else torch's split_module."""
    try:
        from vllm.compilation.backends import split_graph
        split_graph = getattr(split_graph, "__wrapped__", split_graph)  # vLLM's own, not trit's wrapper
        split_gm, items = split_graph(gm, ["trit_repro::attn"])
        return split_gm, {it.submod_name: it.graph for it in items if not it.is_splitting_graph}, "vllm"
    except ImportError:
        from torch.fx.passes.split_module import split_module
        sid, ids = 0, {}
        for n in gm.graph.nodes:
            if n.op in ("output", "placeholder"):
                continue
            if n.op == "call_function" and n.target is torch.ops.trit_repro.attn.default:
                ids[n] = sid + 1
                sid += 2
            else:
                ids[n] = sid
        split_gm = split_module(gm, None, lambda n: ids[n], keep_original_order=True)
        return split_gm, {n: m for n, m in split_gm.named_children() if "attn" not in str(m.code)}, "torch"


def leading_placeholders(gm):
    """vLLM's get_fake_args_from_graph: the example values of the placeholders before the first other node."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            break
        out.append(node.meta["example_value"])
    return out


SPLITTER = []


def backend(gm, example_inputs):
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx

    if FIX:
        localize_sym_predicates(gm)
    split_gm, pieces, who = split(gm)
    SPLITTER.append(who)
    for name, piece in pieces.items():
        if FIX:
            placeholders_first(piece)
        n_ph = len(piece.graph.find_nodes(op="placeholder"))
        args = leading_placeholders(piece)
        print(f"{name}: {n_ph} placeholders, {len(args)} before the first other node", flush=True)
        with detect_fake_mode(args):
            split_gm.__dict__[name] = compile_fx(piece, args)
    return split_gm


def main() -> int:
    torch.manual_seed(0)
    m = Model()
    x = torch.randn(8, 64)
    torch._dynamo.mark_dynamic(x, 0)
    tag = f"{ROUTE} {'fix' if FIX else 'nofix'} {torch.__version__}"
    try:
        f = torch.compile(m, backend=backend, fullgraph=True)
        with torch.no_grad():
            f(x)
            for t in (8, 1, 3):
                xi = torch.randn(t, 64)
                err = float((f(xi) - m(xi)).abs().max())
                assert err < 1e-4, f"{t} tokens: compiled differs from eager by {err}"
    except Exception as e:  # noqa: BLE001 - the point is to report it
        traceback.print_exc(limit=-6)
        print(f"RESULT FAILED {tag} ({SPLITTER[:1]}) {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return 1
    print(f"RESULT ok {tag} ({SPLITTER[:1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
