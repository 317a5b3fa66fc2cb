"""Names that say one thing: no two classes of the package share a name, and no two modules of
one package differ only by a suffix (`stitch` beside `stitcher`, `judge` beside `judging`)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from ..support.paths import REPO

PACKAGE = REPO / "claw_stream"
# what may follow a module's stem in a sibling that is only a form of the same word
SUFFIXES = {"s", "es", "r", "rs", "er", "ers", "or", "ors", "ing", "ings", "ion", "ions", "ed"}


def shared_class_names(root: Path = PACKAGE) -> list[str]:
    """Each class name defined in more than one place, with every file that defines it."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return [
        f"{name}: {', '.join(files)}" for name, files in sorted(where.items()) if len(files) > 1
    ]


def is_suffixed(stem: str, other: str) -> bool:
    """Whether `other` is `stem` plus a suffix: judge/judger, judge/judging, stitch/stitcher,
    stop/stopper."""
    for base in {stem, stem[:-1] if stem.endswith("e") else stem}:
        rest = other[len(base) :] if other.startswith(base) else None
        if rest is None or not rest:
            continue
        if rest in SUFFIXES or (rest[0] == base[-1] and rest[1:] in SUFFIXES):
            return True
    return False


def suffixed_siblings(root: Path = PACKAGE) -> list[str]:
    """Pairs of modules (or subpackages) of one package whose names differ only by a suffix."""
    found = []
    for package in sorted({root, *(p.parent for p in root.rglob("__init__.py"))}):
        names = sorted(
            {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
            | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
        )
        for a in names:
            for b in names:
                if a != b and is_suffixed(a, b):
                    found.append(f"{package.relative_to(root.parent)}: {a} / {b}")
    return found


def test_no_two_classes_share_a_name() -> None:
    assert shared_class_names() == []


def test_no_two_modules_of_a_package_differ_by_a_suffix() -> None:
    assert suffixed_siblings() == []


def test_a_suffixed_sibling_is_named() -> None:
    for stem, other in [
        ("stitch", "stitcher"),
        ("judge", "judger"),
        ("judge", "judging"),
        ("assemble", "assembler"),
        ("record", "records"),
        ("serve", "serving"),
        ("stop", "stopper"),
    ]:
        assert is_suffixed(stem, other), (stem, other)
    for stem, other in [
        ("held_out", "held_out_records"),
        ("store", "stores_of_things"),
        ("door", "doors_x"),
        ("tasks", "task"),
    ]:
        assert not is_suffixed(stem, other), (stem, other)


def test_shared_names_are_found_with_both_files(tmp_path: Path) -> None:
    package = tmp_path / "claw_stream"
    (package / "worker").mkdir(parents=True)
    for path in (package / "__init__.py", package / "worker" / "__init__.py"):
        path.write_text("")
    (package / "events.py").write_text("class Step:\n    pass\n")
    (package / "worker" / "stitch.py").write_text("class Step:\n    pass\n")
    (package / "worker" / "stitcher.py").write_text("")
    assert shared_class_names(package) == [
        "Step: claw_stream/events.py:1, claw_stream/worker/stitch.py:1"
    ]
    assert suffixed_siblings(package) == ["claw_stream/worker: stitch / stitcher"]
