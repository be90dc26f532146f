"""Names for the trace samples shipped in the wheel (``traces/`` -> package ``dsparksim._traces``).

The samples are made from ../shared/data/traces by ``traces/make_samples.py``; provenance and licences are in
``traces/README.md``. A name is resolved to a file here; anything else is taken as a path.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from dsparksim.errors import ConfigError
from dsparksim.io.textio import expand_user, is_file, not_a_file

# name -> (file in traces/, what it is)
SHIPPED: dict[str, tuple[str, str]] = {
    "azure-conv": ("azure_conv_sample.csv", "2,000 random rows of the Azure 2023 conv trace (lengths only)"),
    "azure-code": ("azure_code_sample.csv", "2,000 random rows of the Azure 2023 code trace (lengths only)"),
    "sharegpt": ("sharegpt_sample.csv", "2,000 random rows of sarathi-serve's ShareGPT length stats"),
    "arxiv": ("arxiv_sample.csv", "2,000 random rows of vidur's arXiv-summarization length stats"),
    "azure-conv-window": ("azure_conv_window.csv", "10 contiguous minutes of the Azure 2023 conv trace"),
    "azure-code-window": ("azure_code_window.csv", "10 contiguous minutes of the Azure 2023 code trace"),
    "mooncake-window": ("mooncake_conv_window.jsonl", "5 contiguous minutes of the Mooncake conversation trace"),
    "mooncake-long": ("mooncake_long_sample.csv", "2,000 random Mooncake conversation requests with 8k-128k prompt "
                                                  "tokens (lengths only)"),
}


def traces_dir() -> Path:
    """Folder of the shipped samples: the installed package, or ``traces/`` of a source checkout."""
    try:
        return Path(str(resources.files("dsparksim._traces")))
    except ModuleNotFoundError:  # running from a checkout that is not pip-installed
        return Path(__file__).resolve().parents[2] / "traces"


def shipped_path(name: str) -> Path:
    """Path of a shipped sample by name (see :data:`SHIPPED`)."""
    if name not in SHIPPED:
        raise ConfigError("traffic", "name", f"unknown shipped trace {name!r}; known: {sorted(SHIPPED)}")
    return traces_dir() / SHIPPED[name][0]


def resolve(value: str, field: str) -> tuple[Path, str]:
    """(path, label) for a shipped name or an existing file path; ConfigError otherwise."""
    if value in SHIPPED:
        return shipped_path(value), f"{value} (shipped traces/{SHIPPED[value][0]})"
    path = expand_user(value)
    if not is_file(path):
        if not_a_file(path).startswith("is a directory"):   # it exists: "neither ... nor an existing file" misleads
            raise ConfigError("TrafficConfig", field, f"{value!r} is a directory; expected a trace file (or a "
                              f"shipped sample: {sorted(SHIPPED)})")
        raise ConfigError("TrafficConfig", field, f"{value!r} is neither a shipped sample {sorted(SHIPPED)} nor an "
                          "existing file")
    return path, str(path)
