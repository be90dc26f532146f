"""A tiny TOML writer for the plan tests' specs (the standard library reads TOML but does not write it)."""
from __future__ import annotations


def toml(d) -> str:
    """A tiny TOML writer for the specs of these tests (strings, numbers, bools, lists, tables, [[arrays]])."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)

    out = []
    for t, body in d.items():
        for b in (body if isinstance(body, list) else [body]):
            out.append(f"[[{t}]]" if isinstance(body, list) else f"[{t}]")
            out += [f'"{k}" = {val(v)}' for k, v in b.items()]
    return "\n".join(out) + "\n"
