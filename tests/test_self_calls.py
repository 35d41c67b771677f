"""Every `self.NAME(...)` call in tunekit names something its class (or a base class in the same module) defines: a
rename that misses a caller fails here, not on the one GPU path that reaches it (zoo: gpt2's fp32 fallback)."""
import ast
import pathlib

import tunekit

ROOT = pathlib.Path(tunekit.__file__).parent


def _defined(cls: ast.ClassDef) -> set[str]:
    """Names a class defines: methods, class attributes and what its methods assign to self."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        names |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                  and t.value.id == "self"}
    return names


def _unresolved_self_calls(source: str) -> list[tuple[str, str, int]]:
    """(class, name, line) of each self.NAME(...) that the class cannot have: only classes whose bases are all
    classes of the same module (or none) are checked; one with another base may inherit anything."""
    tree = ast.parse(source)
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = []
    for cls in classes.values():
        chain, names, checkable = [cls], set(), True
        while chain:
            here = chain.pop()
            names |= _defined(here)
            for base in here.bases:
                if isinstance(base, ast.Name) and base.id in classes:
                    chain.append(classes[base.id])
                elif not (isinstance(base, ast.Name) and base.id == "object"):
                    checkable = False
        if not checkable:
            continue
        for node in ast.walk(cls):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
                    and node.func.attr not in names and not node.func.attr.startswith("__")):
                found.append((cls.name, node.func.attr, node.lineno))
    return found


def test_the_check_finds_a_call_to_a_method_that_was_renamed():
    source = "class A:\n    def check(self):\n        pass\n\n    def run(self):\n        self._check()\n"
    assert _unresolved_self_calls(source) == [("A", "_check", 6)]
    assert _unresolved_self_calls(source.replace("self._check()", "self.check()")) == []


def test_every_self_call_in_tunekit_names_a_method_of_its_class():
    missing = [f"{path.relative_to(ROOT)}:{line} {cls}.{name}" for path in sorted(ROOT.rglob("*.py"))
               for cls, name, line in _unresolved_self_calls(path.read_text())]
    assert not missing, missing
