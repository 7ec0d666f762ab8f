"""The runtime catalog: framework + version → entry."""

from __future__ import annotations

import pytest

from kiln.domain.catalog import DEFAULT_CATALOG, Catalog, CatalogEntry
from kiln.domain.spec import RuntimeSpec
from kiln.errors import InvalidInput

CATALOG = Catalog(
    [
        CatalogEntry("torch", "2.12", ("torch==2.12.0",), "img:2.12"),
        CatalogEntry("torch", "2.13", ("torch==2.13.0",), "img:2.13", default=True),
        CatalogEntry("jax", "0.4.30", ("jax==0.4.30",), "jax:0.4.30"),
    ]
)


def test_default_version_is_the_marked_entry() -> None:
    assert CATALOG.resolve("torch").version == "2.13"


def test_without_a_marked_default_the_first_entry_wins() -> None:
    assert CATALOG.resolve("jax").version == "0.4.30"


def test_exact_and_prefix_versions() -> None:
    assert CATALOG.resolve("torch", "2.12").image == "img:2.12"
    assert CATALOG.resolve("jax", "0.4").version == "0.4.30"
    assert CATALOG.resolve("jax", "0").version == "0.4.30"


def test_a_prefix_must_end_at_a_dot() -> None:
    with pytest.raises(InvalidInput):
        CATALOG.resolve("jax", "0.4.3")


def test_unknown_framework_names_the_known_ones() -> None:
    with pytest.raises(InvalidInput) as info:
        CATALOG.resolve("tensorflow")
    assert info.value.message == "runtime.framework: unknown framework 'tensorflow'; known: jax, torch"


def test_unknown_version_names_the_known_ones() -> None:
    with pytest.raises(InvalidInput) as info:
        CATALOG.resolve("torch", "1.0")
    assert info.value.message == "runtime.version: torch has no version '1.0'; known: 2.12, 2.13"


def test_check_only_looks_at_frameworks() -> None:
    CATALOG.check(RuntimeSpec(python="/usr/bin/python3"))
    CATALOG.check(RuntimeSpec(image="whatever:1"))
    CATALOG.check(RuntimeSpec(framework="torch", version="2.12"))
    with pytest.raises(InvalidInput):
        CATALOG.check(RuntimeSpec(framework="torch", version="9"))


def test_default_catalog_resolves_the_default_runtime() -> None:
    entry = DEFAULT_CATALOG.resolve(RuntimeSpec().framework or "")
    assert (entry.framework, entry.name) == ("python", "python-3")
    assert DEFAULT_CATALOG.frameworks() == ["jax", "lightgbm", "python", "pytorch", "sklearn", "tensorflow", "xgboost"]


def test_catalog_file_adds_and_replaces_entries() -> None:
    from kiln.domain.catalog import load_catalog_file

    extra = load_catalog_file(
        "- {framework: pytorch, version: '2.14', packages: [torch==2.14.1], default: true}\n"
        "- {framework: jax, version: '0.10', packages: ['jax[cpu]==0.10.*']}\n",
        "extra.yaml",
    )
    catalog = DEFAULT_CATALOG.extended(extra)
    assert catalog.resolve("pytorch").version == "2.14"  # the new default
    assert catalog.resolve("pytorch", "2.13").packages == DEFAULT_CATALOG.resolve("pytorch").packages  # the old stays
    assert catalog.resolve("jax").packages == ("jax[cpu]==0.10.*",)
    assert sum(e.default for e in catalog.entries if e.framework == "pytorch") == 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("framework: x", "expected a list"),
        ("- {framework: x, version: '1', pakages: []}", "pakages"),
        ("- {framework: '../x', version: '1'}", "framework"),
        ("- [unclosed", "not valid YAML"),
        ("- {framework: x, version: '1+lab', packages: [numpy]}", "must include jupyterlab"),
        ("- {framework: x, version: '1+tensorboard', packages: [numpy]}", "must include tensorboard"),
        ("- {framework: x, version: '1+gpu'}", "version"),
    ],
)
def test_catalog_file_errors_name_the_problem(text: str, needle: str) -> None:
    from kiln.domain.catalog import load_catalog_file

    with pytest.raises(InvalidInput) as err:
        load_catalog_file(text, "extra.yaml")
    assert "extra.yaml" in err.value.message and needle in err.value.message


def test_a_lab_variant_is_derived_unless_the_catalog_has_that_very_version() -> None:
    from kiln.domain.catalog import load_catalog_file

    derived = DEFAULT_CATALOG.resolve("python", "3+lab")
    base = DEFAULT_CATALOG.resolve("python", "3")
    assert derived.derived and not base.derived
    assert derived.image == base.image and derived.packages[: len(base.packages)] == base.packages
    assert any(p.startswith("jupyterlab") for p in derived.packages)
    own = load_catalog_file(
        "- {framework: python, version: '3.12+lab', image: 'registry.example/python-lab:3.12'}\n"
        "- {framework: python, version: '3.11+lab', packages: ['jupyterlab==4.6.0', numpy]}\n",
        "extra.yaml",
    )
    catalog = DEFAULT_CATALOG.extended(own)
    chosen = catalog.resolve("python", "3.12+lab")
    assert (chosen.image, chosen.derived) == ("registry.example/python-lab:3.12", False)  # the operator's image
    assert catalog.resolve("python", "3.11+lab").packages == ("jupyterlab==4.6.0", "numpy")
