"""The package's import graph by layer: imports that run back up LAYERS (bottom first), module cycles, and the
largest modules and functions. `python docs/design/import_layers.py [REPO]` (the figures of issue #31).

A module's layer is its folder, with one folder split in two: strategies/ holds the public, import-light
registry that spec validates a job against (STRATEGY_REGISTRY: names, options, their checks) and the adapters
that run inside the ranks (every other module there). fs/ (the atomic file writer, the JSON reader, safe folders)
sits just above errors. Each back-arrow is printed with the leaf modules (those that import nothing of the
package but errors), since an arrow into a leaf ties no layer to another.
"""
import ast, pathlib, sys, collections
ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2]) / "pytest_distperf"
LAYERS = ["errors", "fs", "strategy registry", "spec", "launch", "rank", "strategies", "figures", "store", "decide",
          "report", "session", "fixture", "plugin", "__main__", "__init__"]
STRATEGY_REGISTRY = {"pytest_distperf.strategies", "pytest_distperf.strategies.registry",
                     "pytest_distperf.strategies.frontend",
                     "pytest_distperf.strategies.ds_config"}
def layer(mod):
    if mod in STRATEGY_REGISTRY:
        return "strategy registry"
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"
edges = collections.defaultdict(set)
files = {}
for p in ROOT.rglob("*.py"):
    rel = p.relative_to(ROOT.parent).with_suffix("")
    mod = ".".join(rel.parts)
    if mod.endswith(".__init__"): mod = mod[:-9]
    files[mod] = p
for mod, p in files.items():
    tree = ast.parse(p.read_text())
    pkg = mod if p.name == "__init__.py" else mod.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                b = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(b + ([base] if base else []))
            targets = [base + "." + a.name if (base + "." + a.name) in files else base for a in node.names]
        for t in targets:
            if t.startswith("pytest_distperf") and t in files and t != mod:
                edges[mod].add((t, node.lineno))
leaves = {m for m, p in files.items() if p.name != "__init__.py" and layer(m) != "errors"
          and all(layer(t) == "errors" for t, _ in edges.get(m, ()))}
back = []
for a, ts in edges.items():
    for b, line in ts:
        la, lb = layer(a), layer(b)
        if la in LAYERS and lb in LAYERS and LAYERS.index(lb) > LAYERS.index(la):
            back.append(f"{a}:{line} -> {b}" + (" (a leaf)" if b in leaves else ""))
print("back-arrows (layer order %s):" % " < ".join(LAYERS[:LAYERS.index("report") + 1]), len(back))
for x in sorted(back): print("  ", x)
# module cycles (Tarjan)
idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w, _ in edges.get(v, ()):
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(comp)
sys.setrecursionlimit(10000)
for v in files:
    if v not in idx: sc(v)
print("module cycles:", len(out))
for comp in out: print("  ", sorted(comp))
sizes = sorted(((len(p.read_text().splitlines()), m) for m, p in files.items()), reverse=True)[:3]
print("largest modules:", sizes)
best = []
for m, p in files.items():
    for n in ast.walk(ast.parse(p.read_text())):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            best.append((n.end_lineno - n.lineno + 1, f"{m}.{n.name}"))
print("largest functions:", sorted(best, reverse=True)[:3])
fe = collections.Counter()
for a, ts in edges.items():
    for b, _ in ts:
        if layer(a) != layer(b): fe[(layer(a), layer(b))] += 1
print("folder edges:", sorted(fe.items()))
