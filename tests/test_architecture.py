"""The shape of the code, checked: kvobs is the base, engine events are dispatched only by observers, a module says
its one concept in its docstring's first line and stays under a size that keeps it one, and the formatter is never
switched off to pack lines. These read the source (ast), so a lazy import inside a function counts as much as one at
the top."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from instrumented_engine.engine import events

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvobs", "instrumented_engine", "collectors", "dashboard")
ABOVE_KVOBS = ("instrumented_engine", "collectors", "dashboard")
MAX_MODULE_LINES = 500  # about one concept; a module past it has become two
EVENT_TYPES = {name for name, obj in vars(events).items() if inspect.isclass(obj) and issubclass(obj, events.KVEvent)}


def _modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py") if "migrations" not in p.parts)


def _imported(tree: ast.AST) -> list[str]:
    """Every module an `import`, `from ... import`, `importlib.import_module(...)` or `find_spec(...)` names."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "import_module",
            "find_spec",
            "__import__",
        ):
            names += [
                arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
            ]
    return names


def test_nothing_in_kvobs_imports_the_engine_the_collectors_or_the_dashboard():
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules("kvobs")
        for name in _imported(ast.parse(path.read_text()))
        if name.split(".")[0] in ABOVE_KVOBS
    ]
    assert offenders == []


def test_no_view_imports_the_engine():
    """A dashboard view renders what the page data modules return (`dashboard.data`, `dashboard.whatif_data`: typed
    results); the engine's replay runs behind those, never in a view, not even lazily."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in (ROOT / "dashboard" / "views").rglob("*.py")
        for name in _imported(ast.parse(path.read_text()))
        if name.split(".")[0] == "instrumented_engine"
    ]
    assert offenders == []


# Packages split into wings by flow: a wing imports the ground (its package's modules outside every wing, and the
# packages below) and itself, never another wing.
WINGS = {
    "collectors": ("kv", "traces", "metrics", "jobs"),
    "kvobs.store": ("sql", "clickhouse"),
}


def _wing_crossings(package: str, wings: tuple[str, ...], modules: dict[str, str]) -> list[str]:
    """`module imports name` for each import, in `modules` (dotted name -> source), from one wing into another."""
    offenders = []
    for module, source in modules.items():
        own = module.removeprefix(package + ".").split(".")[0]
        if own not in wings or module.count(".") == package.count(".") + 1:  # (a module of the ground)
            continue
        for name in _imported(ast.parse(source)):
            other = name.removeprefix(package + ".").split(".")[0] if name.startswith(package + ".") else None
            if other in wings and other != own:
                offenders.append(f"{module} imports {name}")
    return offenders


@pytest.mark.parametrize("package", sorted(WINGS))
def test_a_wing_imports_the_ground_and_itself_never_another_wing(package):
    folder = ROOT / package.replace(".", "/")
    assert all((folder / wing / "__init__.py").exists() for wing in WINGS[package])
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path.read_text()
        for wing in WINGS[package]
        for path in (folder / wing).rglob("*.py")
    }
    assert _wing_crossings(package, WINGS[package], modules) == []


def _upward(package: str, wings: tuple[str, ...], modules: dict[str, str]) -> list[str]:
    """`module imports name` for each import from a wing of a ground module that itself imports a wing: a module
    above the wings (assembly, or a room joining two), which a wing would reach up to."""

    def wing_of(name: str) -> str | None:
        rest = name.removeprefix(package + ".")
        return rest.split(".")[0] if name.startswith(package + ".") and "." in rest else None

    above = {
        module
        for module, source in modules.items()
        if module.count(".") == package.count(".") + 1
        and any(wing_of(name) in wings for name in _imported(ast.parse(source)))
    }
    return [
        f"{module} imports {name}"
        for module, source in modules.items()
        if wing_of(module) in wings
        for name in _imported(ast.parse(source))
        if name in above
    ]


@pytest.mark.parametrize("package", sorted(WINGS))
def test_no_wing_reaches_up_to_a_ground_module_above_the_wings(package):
    """A ground module that imports a wing (the assembly, or a room where two wings meet: `block_owners`) stands
    above them; a wing takes what it needs of it by a type of its own (a Protocol), never by importing it."""
    folder = ROOT / package.replace(".", "/")
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path.read_text() for path in folder.rglob("*.py")
    }
    assert _upward(package, WINGS[package], modules) == []


def test_the_upward_check_sees_a_wing_reaching_up():
    modules = {
        "collectors.block_owners": "from collectors.kv.ingest import KVIngest\n",
        "collectors.drops": "import logging\n",
        "collectors.traces.span_ingest": (
            "from collectors.block_owners import BlockOwners\nfrom collectors.drops import D\n"
        ),
    }
    assert _upward("collectors", WINGS["collectors"], modules) == [
        "collectors.traces.span_ingest imports collectors.block_owners"
    ]


def test_the_wing_check_sees_a_crossing():
    modules = {
        "collectors.kv.ingest": "from collectors.traces.span_steps import SpanSteps\nfrom collectors.drops import X\n",
        "collectors.traces.span_ingest": "from collectors.traces.span_steps import SpanSteps\n",
    }
    crossings = _wing_crossings("collectors", WINGS["collectors"], modules)
    assert crossings == ["collectors.kv.ingest imports collectors.traces.span_steps"]


# The analyses' two wings, each reached through its door (the wing's package): the cache's (what the KV cache did, no
# step in it) and the steps' above it (why a step failed or got slow). The ground (kvobs.analytics' own modules)
# imports neither.
ANALYTICS = "kvobs.analytics"
ANALYTICS_WINGS = ("cache", "steps")  # in floor order: a wing imports only the doors of those before it
MAX_ANALYTICS_ROOT = 12
MAX_DASHBOARD_ANALYTICS = 6


def _analytics_names(tree: ast.AST) -> list[str]:
    """Every module an import names, with `from pkg import room` as `pkg.room` (a room taken by its door's name)."""
    names = _imported(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            folder = ROOT / node.module.replace(".", "/")
            names += [f"{node.module}.{alias.name}" for alias in node.names if (folder / f"{alias.name}.py").exists()]
    return names


def _analytics_crossings(modules: dict[str, str]) -> list[str]:
    """`module imports name` for each import, in `modules` (dotted name -> source), that passes a wing's door (a room
    of a wing imported from outside it), climbs a floor (a wing, or the ground, importing a wing above it), or enters
    its own wing by the door (a room importing its door, a circle)."""

    def wing_of(name: str) -> str | None:
        parts = name.removesuffix(".__init__").split(".")
        return parts[2] if name.startswith(ANALYTICS + ".") and len(parts) > 2 and parts[2] in ANALYTICS_WINGS else None

    offenders = []
    for module, source in modules.items():
        own = wing_of(module)
        is_door = module.removesuffix(".__init__") == f"{ANALYTICS}.{own}"
        floor = (
            ANALYTICS_WINGS.index(own) if own else (-1 if module.startswith(ANALYTICS + ".") else len(ANALYTICS_WINGS))
        )
        for name in _analytics_names(ast.parse(source)):
            other = wing_of(name)
            if other is None:
                continue
            door = name == f"{ANALYTICS}.{other}"
            if (
                (not door and other != own)
                or ANALYTICS_WINGS.index(other) > floor
                or (door and other == own and not is_door)
            ):
                offenders.append(f"{module} imports {name}")
    return sorted(set(offenders))


def _code_modules() -> dict[str, str]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path.read_text()
        for path in _modules(*PACKAGES, "bench")
    }


def test_the_analyses_are_reached_through_their_wings_doors():
    """Outside a wing, code imports its door (`kvobs.analytics.steps`, `kvobs.analytics.cache`) and none of its rooms;
    the cache's wing never imports the steps'; the ground imports neither."""
    assert all((ROOT / "kvobs/analytics" / wing / "__init__.py").exists() for wing in ANALYTICS_WINGS)
    assert _analytics_crossings(_code_modules()) == []


def test_the_door_check_sees_each_crossing():
    modules = {
        "dashboard.data": "from kvobs.analytics.steps.attribution import attribute_steps\n",
        "dashboard.views.step": "from kvobs.analytics.steps import story\nfrom kvobs.analytics.steps import DECIDED\n",
        "kvobs.analytics.cache.routing": "from kvobs.analytics.steps import step_causes\n",
        "kvobs.analytics.windows": "from kvobs.analytics.cache import hit_rate_in\n",
        "kvobs.analytics.steps.story": (
            "from kvobs.analytics.steps import step_causes\nfrom kvobs.analytics.cache import X\n"
        ),
        "kvobs.analytics.steps.__init__": "from kvobs.analytics.steps.story import step_story\n",
        "kvobs.alerts.signals": (
            "from kvobs.analytics.cache import hit_rates_in\nfrom kvobs.analytics.windows import w\n"
        ),
    }
    assert _analytics_crossings(modules) == [
        "dashboard.data imports kvobs.analytics.steps.attribution",
        "dashboard.views.step imports kvobs.analytics.steps.story",
        "kvobs.analytics.cache.routing imports kvobs.analytics.steps",
        "kvobs.analytics.steps.story imports kvobs.analytics.steps",
        "kvobs.analytics.windows imports kvobs.analytics.cache",
    ]


def test_the_analyses_keep_a_small_root_and_the_dashboard_few_doors():
    root = [path.name for path in (ROOT / "kvobs/analytics").glob("*.py")]
    assert len(root) <= MAX_ANALYTICS_ROOT, root
    dashboard = {
        name
        for module, source in _code_modules().items()
        if module.startswith("dashboard.")
        for name in _imported(ast.parse(source))
        if name.startswith(ANALYTICS + ".")
    }
    assert len(dashboard) <= MAX_DASHBOARD_ANALYTICS, sorted(dashboard)


def test_the_architecture_check_sees_a_lazy_import():
    lazy = "def run():\n    from instrumented_engine.server.launcher import EngineServer\n"
    spec = "import importlib.util\nimportlib.util.find_spec('dashboard.app')\n"
    assert _imported(ast.parse(lazy)) == ["instrumented_engine.server.launcher"]
    assert "dashboard.app" in _imported(ast.parse(spec))


def _event_type_checks(tree: ast.AST) -> list[int]:
    """Lines of `isinstance(x, T)` where T (or a member of a tuple T) names an engine event type."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            types = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            named = {getattr(t, "attr", getattr(t, "id", None)) for t in types}
            if named & EVENT_TYPES:
                lines.append(node.lineno)
    return lines


def test_only_observers_dispatch_on_engine_event_types():
    observers = ROOT / "instrumented_engine" / "observers"
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules(*PACKAGES)
        if observers not in path.parents
        for line in _event_type_checks(ast.parse(path.read_text()))
    ]
    assert offenders == []


def test_the_dispatch_check_sees_an_isinstance_chain():
    chain = "if isinstance(event, ev.BlockEvicted):\n    pass\nelif isinstance(event, (CacheCleared, int)):\n    pass\n"
    assert _event_type_checks(ast.parse(chain)) == [1, 3]
    assert {"BlockEvicted", "CacheCleared", "PrefixLookup"} <= EVENT_TYPES


@pytest.mark.parametrize("path", _modules(*PACKAGES), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_names_its_one_concept_and_stays_small(path):
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert docstring.strip(), "the module's docstring says, in its first line, the one concept it holds"
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


def test_the_formatter_is_never_switched_off():
    """ruff formats every line; a table that reads better aligned may switch it off only with its reason on the line
    above (`# aligned: ...`)."""
    offenders = []
    for path in sorted(ROOT.glob("**/*.py")):
        if any(part.startswith(".venv") for part in path.parts) or "migrations" in path.parts:
            continue  # (.venv and the tests' other environments, .venv-llamaindex: not ours)
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            switched_off = any(f"# fmt: {word}" in line for word in ("skip", "off"))
            if switched_off and not (number and "# aligned:" in lines[number - 1]):
                offenders.append(f"{path.relative_to(ROOT)}:{number + 1}")
    assert offenders == []


# ---- store backends: chosen by URL scheme, held to the protocols -----------------------------------------------
BACKEND_MODULES = ("kvobs/store/sql/", "kvobs/store/schema.py", "kvobs/store/uint64.py", "kvobs/store/clickhouse/")


def _dialect_branches(tree: ast.AST) -> list[int]:
    """Lines comparing a database's dialect (`x.dialect`, `x.dialect.name`, `dialect`) with a string."""

    def is_dialect(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "name":
            node = node.value
        return (isinstance(node, ast.Attribute) and node.attr == "dialect") or (
            isinstance(node, ast.Name) and node.id in ("dialect", "dialect_name")
        )

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(is_dialect(side) for side in (node.left, *node.comparators))
        and any(isinstance(side, ast.Constant | ast.Tuple | ast.List) for side in (node.left, *node.comparators))
    ]


def test_no_dialect_branches_outside_the_backends():
    """Code above the store asks its `reads`, `lookups` or `write`, never which database it is talking to."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules(*PACKAGES, "bench")
        if not str(path.relative_to(ROOT)).startswith(BACKEND_MODULES)
        for line in _dialect_branches(ast.parse(path.read_text()))
    ]
    assert offenders == []


def test_the_dialect_check_sees_a_branch():
    assert _dialect_branches(ast.parse('if store.dialect == "clickhouse":\n    pass\n')) == [1]
    assert _dialect_branches(ast.parse('x = engine.dialect.name in ("sqlite",)\n')) == [1]
    assert _dialect_branches(ast.parse("x = store.dialect\n")) == []


def test_every_registered_backend_is_type_checked():
    """Each opener in `kvobs.store.db.BACKENDS` is in the `OPENERS` tuple the type checker reads, so what it opens
    is held to `kvobs.store.interface.Store` (tests/test_types.py)."""
    from kvobs.store.db import BACKENDS

    tree = ast.parse((ROOT / "kvobs/store/db.py").read_text())
    (openers,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "OPENERS"
    ]
    checked = {element.id for element in ast.walk(openers) if isinstance(element, ast.Name)}
    assert {target.partition(":")[2] for target in BACKENDS.values()} <= checked
