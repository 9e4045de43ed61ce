"""The house's shape: imports go one way between tfm_jax/'s folders, no import cycle, nothing
imports the CLI or private names from outside, every module says what it is for, and no module
passes the line limit."""

import ast
import os

from helpers import REPO

ROOT = os.path.join(REPO, "tfm_jax")
LINE_LIMIT = 450
# Over the limit when the limit was set; to be split (issue 14). Lower a ceiling when a module
# shrinks; never raise one.
CEILINGS: dict[str, int] = {}  # dotted module -> a temporary ceiling above LINE_LIMIT

# tfm_jax/'s folders (and its two base modules) in the order data flows: a module may import
# its own folder and those before it, never one after it. checkpoint/ stores pytrees and knows
# no model, so the training loop (train/) can save through it.
LAYERS = ["platform", "vocab_ids", "config", "data", "model", "checkpoint", "train", "decode",
          "eval", "viz", "cli"]  # fmt: skip


def modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imports(path: str, known: dict[str, str]) -> set[str]:
    """The tfm_jax modules a file imports, at any depth of the file (lazy imports count too)."""
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfm_jax"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                out.add(candidate if candidate in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("tfm_jax")}
    return {m for m in out if m in known}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    known = modules()
    graph = {m: imports(p, known) - {m} for m, p in known.items()}
    graph["tfm_jax"] = set()  # the package's __init__ imports nothing of its own
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_modules_stay_under_the_line_limit():
    over = {}
    for dotted, path in modules().items():
        with open(path, encoding="utf-8") as f:
            lines = len(f.read().splitlines())
        if lines > CEILINGS.get(dotted, LINE_LIMIT):
            over[dotted] = lines
    assert not over, f"modules over {LINE_LIMIT} lines (or their ceiling): {over}"


def layer(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "tfm_jax"


def test_imports_go_one_way():
    known = modules()
    backwards = []
    for m, path in known.items():
        if layer(m) not in LAYERS:  # tfm_jax/__init__.py, __main__.py (calls cli.main)
            continue
        for imported in imports(path, known):
            if layer(imported) in LAYERS and LAYERS.index(layer(imported)) > LAYERS.index(layer(m)):
                backwards.append(f"{m} imports {imported}")
    assert not backwards, "imports against the flow " + " -> ".join(LAYERS) + f": {backwards}"


def test_inference_never_builds_the_training_machinery():
    """decode/ and eval/ (and the reading commands) load a run through model/scoring.py: the
    model and its params' shapes, never an optimizer or a train step from train/."""
    known = modules()
    reaching = [
        f"{m} imports {imported}"
        for m, path in known.items()
        if layer(m) in ("decode", "eval", "viz") or m == "tfm_jax.cli.inference"
        for imported in imports(path, known)
        if layer(imported) == "train"
    ]
    assert not reaching, reaching


MUTABLE_CALLS = {"set", "list", "dict", "defaultdict", "collections.defaultdict", "OrderedDict",
                 "collections.OrderedDict", "deque", "collections.deque", "Counter"}  # fmt: skip
MUTATING_METHODS = {"append", "add", "update", "extend", "insert", "pop", "popitem", "clear",
                    "discard", "remove", "setdefault", "__setitem__"}  # fmt: skip


def _module_state(tree: ast.Module) -> set[str]:
    """Module-level names bound to a mutable container (a display or a constructor call)."""
    names = set()
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        mutable = isinstance(value, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp
                             | ast.SetComp) or (isinstance(value, ast.Call)
                                                and _call_name(value) in MUTABLE_CALLS)  # fmt: skip
        names |= {t.id for t in targets if mutable and isinstance(t, ast.Name)}
    return names


def _state_changes(tree: ast.Module, dotted: str) -> list[str]:
    """Where code rebinds a global or mutates a module-level container."""
    state, bad = _module_state(tree), []
    for node in ast.walk(tree):
        where = f"{dotted}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Global):
            bad.append(f"{where}: global {', '.join(node.names)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (isinstance(owner, ast.Name) and owner.id in state
                    and node.func.attr in MUTATING_METHODS):  # fmt: skip
                bad.append(f"{where}: {owner.id}.{node.func.attr}(...)")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
            for t in targets:
                if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                        and t.value.id in state):  # fmt: skip
                    bad.append(f"{where}: {t.value.id}[...] changed")
    return bad


def test_no_mutable_module_state():
    """Nothing a call does changes what a later call computes through a module global: no
    `global` rebinding, and no module-level container that code mutates (constants such as
    RANGES or EXIT_CODES are only read). Memos of pure functions (functools.cache) are fine."""
    bad = []
    for dotted, path in modules().items():
        bad += _state_changes(ast.parse(open(path, encoding="utf-8").read()), dotted)
    assert not bad, "mutable module-level state: pass it explicitly instead: " + "; ".join(bad)


def test_the_state_check_finds_state():
    code = (
        "SEEN = set()\nN = [0]\nK = {'a': 1}\nmode = 'x'\n"
        "def f(x):\n    global mode\n    SEEN.add(x)\n    N[0] += 1\n    return K['a']\n"
    )
    tree = ast.parse(code)
    assert _module_state(tree) == {"SEEN", "N", "K"}
    assert {b.split(": ", 1)[1] for b in _state_changes(tree, "m")} == {
        "global mode", "SEEN.add(...)", "N[...] changed"}  # K is only read  # fmt: skip


def test_layers_cover_every_folder():
    folders = {layer(m) for m in modules()} - {"tfm_jax", "__main__"}
    assert folders <= set(LAYERS), f"place {sorted(folders - set(LAYERS))} in LAYERS"


def test_every_module_opens_with_its_role():
    missing = []
    for dotted, path in modules().items():
        doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read()))
        if not doc or len(doc.split()) < 4:
            missing.append(dotted)
    assert not missing, f"modules without a docstring saying what they are for: {missing}"


def _python_files(*folders):
    for folder in folders:
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            yield from (os.path.join(root, f) for f in files if f.endswith(".py"))


def test_only_the_cli_imports_the_cli_and_outsiders_use_public_names():
    """experiments/ and configs/ use the library's public functions; nothing but tfm_jax/cli/
    and tfm_jax/__main__.py imports tfm_jax.cli (tests drive it as users do)."""
    bad = []
    for path in _python_files("tfm_jax", "experiments", "configs"):
        rel = os.path.relpath(path, REPO)
        in_cli = rel.startswith(os.path.join("tfm_jax", "cli")) or rel.endswith("__main__.py")
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "tfm_jax"
            ):
                continue
            names = [f"{node.module}.{a.name}" for a in node.names]
            if not in_cli and any(n.startswith("tfm_jax.cli") for n in [node.module, *names]):
                bad.append(f"{rel} imports {node.module}")
            if not rel.startswith("tfm_jax"):
                bad += [f"{rel} imports private {n}" for n in names if n.split(".")[-1][0] == "_"]
    assert not bad, bad


def test_the_library_imports_no_experiment_config_or_test():
    bad = []
    for path in _python_files("tfm_jax"):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            mods = []
            if isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            bad += [
                f"{path}: {m}"
                for m in mods
                if m.split(".")[0] in ("configs", "experiments", "tests")
            ]
    assert not bad, bad


# Calls that touch files other than through tfm_jax/platform/storage.py (epath: local and gs://).
FILE_CALLS = {
    "open", "os.open", "os.makedirs", "os.mkdir", "os.listdir", "os.scandir", "os.walk",
    "os.remove", "os.unlink", "os.rename", "os.replace", "os.stat", "os.path.exists",
    "os.path.isfile", "os.path.isdir", "os.path.getsize", "os.path.getmtime", "glob.glob",
    "np.load", "np.save", "shutil.rmtree", "shutil.copyfile", "shutil.copy", "shutil.move",
}  # fmt: skip
# Where a local file is the point, and why (module, or module:function).
LOCAL_FILES_ALLOWED = {
    "tfm_jax.platform.storage": "the one implementation of local + gs:// files",
    "tfm_jax.platform.host": "/proc and the malloc re-exec: this machine's own files",
    "tfm_jax.platform.cpu": "CPU-only: /proc and /sys",
    "tfm_jax.platform.cluster": "/proc/driver/nvidia: this machine's GPUs",
    "tfm_jax.platform.runtime": "JAX's compilation cache: a local folder JAX itself writes",
    "tfm_jax.data.token_cache": "memory-mapped .npy files must be local; a gs:// cache goes "
    "through data/cache_mirror.py into a local mirror first",
    "tfm_jax.data.cache_mirror": "the local mirror of a gs:// token cache",
    "tfm_jax.config.build": "config files are local Python modules, executed",
    "tfm_jax.config.paths": "resolving local paths (URLs are handed to storage)",
    "tfm_jax.platform.lease": "a local lease is a compare-and-swap under fcntl.flock, which "
    "needs a local file descriptor (gs:// goes through google-cloud-storage's preconditions)",
}


def _call_name(node: ast.Call) -> str:
    parts, f = [], node.func
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    return ".".join(reversed(parts))


def test_workdir_files_go_through_the_storage_layer():
    """Every file under a workdir, data dir, vocabulary or token cache is read and written
    through platform/storage.py (or Orbax / tensorboardX), so that gs:// works everywhere and
    nothing writes into a local folder named after a URL."""
    bad = []
    for dotted, path in modules().items():
        if dotted in LOCAL_FILES_ALLOWED:
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Call):
                name = _call_name(node)
                # savefig(path) writes a file; savefig(buffer, format=...) renders in memory
                to_file = name.endswith(".savefig") and not any(
                    k.arg == "format" for k in node.keywords
                )
                if name in FILE_CALLS or to_file:
                    if name == "open" and node.args and isinstance(node.args[0], ast.Constant):
                        continue  # a fixed local path ("/proc/...")
                    bad.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: {name}(...)")
    assert not bad, "use tfm_jax.platform.storage (local and gs://) instead: " + "; ".join(bad)


# ---- experiments/: a package held to the library's rules ----

EXPERIMENTS = "experiments"
# Where the repo's Python may change sys.path: nowhere but pytest's own entry point (tests find
# `helpers` as pytest's rootdir conftest puts tests/ first; `experiments` through setup.cfg's
# pythonpath; scripts run as `python -m`).
SYS_PATH_ALLOWED = {os.path.join("tests", "conftest.py")}


def _tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def experiment_modules() -> dict[str, str]:
    """experiments/'s modules, dotted (experiments.table3.stats) -> path."""
    found = {}
    for path in _python_files(EXPERIMENTS):
        dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        found[dotted.removesuffix(".__init__")] = path
    return found


def experiment_imports(path: str, known: dict[str, str]) -> set[str]:
    """The experiments modules a file imports, at any depth of the file."""
    out = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == EXPERIMENTS:
                for alias in node.names:
                    candidate = f"{node.module}.{alias.name}"
                    out.add(candidate if candidate in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == EXPERIMENTS}
    return {m for m in out if m in known}


def test_experiment_modules_stay_under_the_line_limit():
    over = {}
    for dotted, path in experiment_modules().items():
        with open(path, encoding="utf-8") as f:
            lines = len(f.read().splitlines())
        if lines > LINE_LIMIT:
            over[dotted] = lines
    assert not over, f"modules over {LINE_LIMIT} lines: {over}"


def test_every_experiment_module_opens_with_its_role():
    missing = []
    for dotted, path in experiment_modules().items():
        doc = ast.get_docstring(_tree(path))
        if not doc or len(doc.split()) < 4:
            missing.append(dotted)
    assert not missing, f"modules without a docstring saying what they are for: {missing}"


def test_every_experiments_folder_is_a_package():
    """Each folder of experiments/ with Python in it has an __init__.py: its modules are
    imported as experiments.<folder>.<module>, not as files."""
    bare = []
    for root, _, files in os.walk(os.path.join(REPO, EXPERIMENTS)):
        if any(f.endswith(".py") for f in files) and "__init__.py" not in files:
            bare.append(os.path.relpath(root, REPO))
    assert not bare, f"folders of Python modules without an __init__.py: {bare}"


def test_experiments_import_each_other_as_a_package():
    """`from experiments.table3 import stats`, never `import table3_stats` (a file found through
    sys.path) or a relative import (which the cycle check below would not see)."""
    local = {dotted.split(".")[-1] for dotted in experiment_modules()} - {EXPERIMENTS}
    bad = []
    for dotted, path in experiment_modules().items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.level:
                bad.append(f"{dotted}: relative import from {'.' * node.level}{node.module or ''}")
                continue
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad += [f"{dotted} imports {n}" for n in names if n.split(".")[0] in local]
    assert not bad, f"import experiments' modules as experiments.*: {bad}"


def test_experiments_have_no_import_cycle():
    known = experiment_modules()
    graph = {m: experiment_imports(p, known) - {m} for m, p in known.items()}
    assert graph["experiments.table3.sweep"] >= {"experiments.table3.stats"}  # the edges are seen
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_experiments_import_no_tests():
    bad = []
    for dotted, path in experiment_modules().items():
        for node in ast.walk(_tree(path)):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            bad += [f"{dotted}: {m}" for m in mods if m.split(".")[0] in ("tests", "helpers")]
    assert not bad, bad


def _edits_sys_path(node: ast.AST) -> bool:
    """sys.path.insert(...) / .append / .extend / ..., or sys.path (or a slice of it) assigned."""

    def is_sys_path(n):
        return (
            isinstance(n, ast.Attribute)
            and n.attr == "path"
            and isinstance(n.value, ast.Name)
            and n.value.id == "sys"
        )

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return is_sys_path(node.func.value)
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(is_sys_path(t.value if isinstance(t, ast.Subscript) else t) for t in targets)
    return False


def test_edits_sys_path_finds_one():
    found = [_edits_sys_path(n) for n in ast.walk(ast.parse(
        "import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nsys.path += ['z']\n"
        "print(sys.path)\nos.path.join('a')\n"
    ))]  # fmt: skip
    assert sum(found) == 3


def test_nothing_edits_sys_path():
    """Modules import each other as packages (tfm_jax, experiments, tests' helpers), so no file
    needs to put a folder on sys.path; a script runs as `python -m`."""
    top = [os.path.join(REPO, f) for f in os.listdir(REPO) if f.endswith(".py")]
    bad = []
    for path in [*top, *_python_files("tfm_jax", "configs", EXPERIMENTS, "tests")]:
        rel = os.path.relpath(path, REPO)
        if rel in SYS_PATH_ALLOWED:
            continue
        bad += [f"{rel}:{n.lineno}" for n in ast.walk(_tree(path)) if _edits_sys_path(n)]
    assert not bad, f"sys.path edited (import as a package, run as `python -m`): {bad}"
