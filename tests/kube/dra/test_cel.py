"""DRA device selectors: Kubernetes' CEL environment, its libraries, and every refusal with its words.

The first table is the one ``k8s.io/dynamic-resource-allocation/cel/compile_test.go`` (v0.37.2) runs against
cel-go, case for case where kubecell evaluates the same thing; then the selectors kube-scheduler's docs and
NVIDIA's DRA driver examples write, written for ``gpu.kubecell.io``.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from kubecell.kube.dra import cel as cel_module
from kubecell.kube.dra.cel import (
    MAX_EXPRESSION_BYTES,
    AttributeValue,
    CelDevice,
    SelectorError,
    compile_selector,
    device_matches,
)
from kubecell.kube.dra.cel_check import MAX_COST
from kubecell.kube.dra.cel_types import Semver, parse_semver

EXAMPLE = "dra.example.com"


def device(driver: str = EXAMPLE, attributes: dict[str, AttributeValue] | None = None,
           capacity: dict[str, str] | None = None, *, multiple: bool = False) -> CelDevice:
    from kubecell.kube.dialects.resources import parse_quantity

    return CelDevice.of(driver, attributes or {}, {k: parse_quantity(v) for k, v in (capacity or {}).items()},
                        allow_multiple_allocations=multiple)


# (expression, device, expected: True/False, or the text of the runtime error)
UPSTREAM = [
    ("true", device(), True),
    ("false", device(), False),
    ('device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))', device(),
     "no such key: noSuchAttr"),
    ('device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))', device(),
     "no such key: noSuchAttr"),
    ('"no-such-domain" in device.attributes', device(), False),
    ('"dra.example.com" in device.attributes', device(attributes={"dra.example.com/something": True}), True),
    ('device.driver == ""', device(""), True),
    ('device.driver == "dra.example.com"', device(), True),
    ('device.attributes["dra.example.com"].name', device(attributes={"name": True}), True),
    ('device.attributes["dra.example.com"]["name"]', device(attributes={"name": True}), True),
    ('cel.bind(dra, device.attributes["dra.example.com"], dra.name)', device(attributes={"name": True}), True),
    ('device.attributes["other.example.com"].name', device(attributes={"other.example.com/name": True}), True),
    ('device.attributes["dra.example.com"].name > 0', device(attributes={"name": 1}), True),
    ('device.attributes["dra.example.com"].name == "fish"', device(attributes={"name": "fish"}), True),
    ('device.attributes["dra.example.com"].name.isGreaterThan(semver("0.0.1"))',
     device(attributes={"name": parse_semver("1.0.0")}), True),
    ('device.attributes["dra.example.com"].name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)',
     device(attributes={"name": parse_semver("1.0.0")}), True),
    ('device.capacity["dra.example.com"].name.isGreaterThan(quantity("1Ki"))', device(capacity={"name": "1Mi"}),
     True),
    ('"name" in device.capacity["dra.example.com"] && device.capacity["dra.example.com"].name.isGreaterThan('
     'quantity("1Ki"))', device(capacity={"name": "1Mi"}), True),
    ('!("name" in device.capacity["dra.example.com"]) || device.capacity["dra.example.com"].name.isGreaterThan('
     'quantity("1Ki"))', device(), True),
    ('device.attributes["dra.example.com"].a && device.attributes["dra.example.com"].b && '
     'device.attributes["dra.example.com"].c', device(attributes={"a": True, "b": True, "c": True}), True),
    ('device.attributes.exists_one(x, x == "dra.example.com")', device(attributes={"services": "x"}), True),
    ('device.attributes["dra.example.com"].exists_one(x, x == "services")', device(attributes={"services": "x"}),
     True),
    ('device.attributes["dra.example.com"].services.split("example").size() >= 2',
     device(attributes={"services": "some_example_value"}), True),
    ('device.attributes["dra.example.com"].services.matches("[^a]?sym")', device(attributes={"services": "asymetric"}),
     True),
    ('device.capacity.exists_one(x, x == "dra.example.com")', device(capacity={"memory": "1Mi"}), True),
    ('device.capacity["dra.example.com"].exists_one(x, x == "memory")', device(capacity={"memory": "1Mi"}), True),
    ("device.allowMultipleAllocations == true", device(multiple=True), True),
    ("device.allowMultipleAllocations == false", device(), True),
    ('device.attributes["dra.example.com"].name.includes("fish")', device(attributes={"name": "fish"}), True),
    ('device.attributes["dra.example.com"].names.size() == 2', device(attributes={"names": ("a", "b")}), True),
    ('device.attributes["dra.example.com"].names.exists(x, x > 0)', device(attributes={"names": (0, 1)}), True),
    ('device.attributes["dra.example.com"].names.all(x, x.isGreaterThan(semver("0.0.1")))',
     device(attributes={"names": (parse_semver("1.0.0"), parse_semver("0.1.0"))}), True),
    ('1 in device.attributes["dra.example.com"].names', device(attributes={"names": (1, 2)}), True),
    ('device.attributes["dra.example.com"].names', device(attributes={"names": ("a",)}),
     "must evaluate to bool, not list"),
    ('device.attributes["dra.example.com"].name.exists(x, x > 0)', device(attributes={"name": 1}), "failed"),
]


@pytest.mark.parametrize(("expression", "dev", "expected"), UPSTREAM, ids=[c[0][:60] for c in UPSTREAM])
def test_upstream_cases(expression: str, dev: CelDevice, expected: bool | str) -> None:
    selector = compile_selector(expression)
    if isinstance(expected, bool):
        assert selector.matches(dev) is expected
    else:
        with pytest.raises(SelectorError) as raised:
            selector.matches(dev)
        assert raised.value.kind == "runtime"
        assert expected in str(raised.value)


GPU = "gpu.kubecell.io"
A100 = CelDevice.of(GPU, {"type": "gpu", "uuid": "GPU-1", "model": "A100-SXM4-40GB", "index": 3, "numaNode": 1,
                          "driverVersion": parse_semver("550.54.15"), "cudaComputeCapability": parse_semver("8.0.0"),
                          "resource.kubernetes.io/pcieRoot": "pci0000:00"},
                    {"memory": Decimal(40960 * 2**20), "compute": Decimal(1000)}, allow_multiple_allocations=True)
MIG = CelDevice.of(GPU, {"type": "mig", "uuid": "MIG-1", "profile": "1g.5gb", "model": "MIG-1g.5gb"},
                   {"memory": Decimal(4864 * 2**20)})

DOCS = [
    # kube-scheduler's DRA documentation and NVIDIA's dra-driver-nvidia-gpu examples, for this driver
    (f'device.driver == "{GPU}" && device.attributes["{GPU}"].type == "gpu"', True, False),
    (f'device.attributes["{GPU}"].model == "A100-SXM4-40GB"', True, False),
    (f'device.capacity["{GPU}"].memory.compareTo(quantity("10Gi")) >= 0', True, False),
    (f'device.capacity["{GPU}"].memory.isGreaterThan(quantity("40Gi"))', False, False),
    (f'device.capacity["{GPU}"].memory.compareTo(quantity("40960Mi")) == 0', True, False),
    (f'device.attributes["{GPU}"].driverVersion.compareTo(semver("550.0.0")) >= 0', True, None),
    (f'device.attributes["{GPU}"].cudaComputeCapability.isGreaterThan(semver("7.5.0"))', True, None),
    (f'device.attributes["{GPU}"].driverVersion.major() == 550', True, None),
    (f'device.attributes["{GPU}"].model.matches("^A100")', True, False),
    (f'device.attributes["{GPU}"].model.lowerAscii().contains("a100")', True, False),
    (f'device.attributes["{GPU}"].profile == "1g.5gb"', None, True),
    (f'"profile" in device.attributes["{GPU}"] && device.attributes["{GPU}"].profile == "1g.5gb"', False, True),
    (f'has(device.attributes["{GPU}"].index) && device.attributes["{GPU}"].index < 4', True, False),
    (f'cel.bind(gpu, device.attributes["{GPU}"], gpu.type == "gpu" && gpu.numaNode == 1)', True, False),
    (f'device.attributes["{GPU}"].model in ["A100-SXM4-40GB", "H100-SXM5-80GB"]', True, False),
    ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"', True, None),
    ("device.allowMultipleAllocations", True, False),
]


@pytest.mark.parametrize(("expression", "on_gpu", "on_mig"), DOCS, ids=[c[0][:60] for c in DOCS])
def test_documented_selectors(expression: str, on_gpu: bool | None, on_mig: bool | None) -> None:
    """None: the selector fails on that device (an attribute it does not have), as cel-go's does."""
    for dev, expected in ((A100, on_gpu), (MIG, on_mig)):
        if expected is None:
            with pytest.raises(SelectorError, match="no such key"):
                device_matches(expression, dev)
        else:
            assert device_matches(expression, dev) is expected


LIBRARY = [
    # quantity (k8s.io/apiserver/pkg/cel/library/quantity.go's documented examples)
    'quantity("1Gi") == quantity("1024Mi")',
    'quantity("200M").compareTo(quantity("0.2G")) == 0',
    'quantity("50M").compareTo(quantity("50Mi")) == -1',
    'quantity("150Mi").isGreaterThan(quantity("100Mi"))',
    'quantity("50M").isLessThan(quantity("100M"))',
    'isQuantity("1.3G") && isQuantity("10000k") && !isQuantity("200K") && !isQuantity("Three") && !isQuantity("Mi")',
    'quantity("50k").asInteger() == 50000 && quantity("50000000G").isInteger() && !quantity("1500m").isInteger()',
    'quantity("50k").sub(20000).asApproximateFloat() == 30000.0',
    'quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")',
    'sign(quantity("-3")) == -1 && sign(quantity("0")) == 0',
    # semver (semverlib.go)
    'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3',
    'semver("1.0.0-alpha").isLessThan(semver("1.0.0")) && semver("1.0.0-alpha.1").isGreaterThan(semver("1.0.0-alpha"))',
    'semver("1.0.0-2").isLessThan(semver("1.0.0-alpha"))',
    'semver("1.0.0+build.5") == semver("1.0.0")',
    'isSemver("1.2.3") && !isSemver("v1.2.3") && isSemver("v1.2", true) && !isSemver("01.2.3")',
    'semver("v01.2", true) == semver("1.2.0")',
    # strings, version 2 (cel-go ext/strings.go)
    '"TacoCat".lowerAscii() == "tacocat" && "TacoCÆt".upperAscii() == "TACOCÆT"',
    '"hello".charAt(1) == "e" && "hello".charAt(5) == ""',
    '"hello mellow".indexOf("ello") == 1 && "hello mellow".indexOf("ello", 2) == 7 && "hello".indexOf("") == 0',
    '"hello mellow".lastIndexOf("ello") == 7 && "hello mellow".lastIndexOf("ello", 6) == 1',
    '"hello hello".replace("he", "we") == "wello wello" && "hello hello".replace("he", "we", 1) == "wello hello"',
    '"a,b,c".split(",") == ["a", "b", "c"] && "a,b,c".split(",", 2) == ["a", "b,c"] && "a,b".split(",", 0) == []',
    '"tacocat".substring(4) == "cat" && "tacocat".substring(0, 4) == "taco"',
    '"  \\ttrim\\n ".trim() == "trim"',
    '["a", "b"].join() == "ab" && ["a", "b"].join("-") == "a-b"',
    # regex (k8s library)
    '"abc 123".find("[0-9]+") == "123" && "abc".find("[0-9]+") == ""',
    '"123 abc 456".findAll("[0-9]+") == ["123", "456"] && "123 abc 456".findAll("[0-9]+", 1) == ["123"]',
    # lists (k8s library and cel-go ext/lists.go), sets
    "[1, 2, 3].isSorted() && ![2, 1].isSorted() && [1, 3].sum() == 4 && [].sum() == 0",
    "[1, 3].min() == 1 && [1, 3].max() == 3",
    "[1, 2, 2, 3].indexOf(2) == 1 && [1, 2, 2, 3].lastIndexOf(2) == 2 && [1].indexOf(5) == -1",
    "[1, 2, 3].includes(2) && ![1, 2, 3].includes(4)",
    "[1, 2, 2, 1].distinct() == [1, 2] && [[1], [2, 3]].flatten() == [1, 2, 3] && [1, 2].reverse() == [2, 1]",
    "[1, 2, 3, 4].slice(1, 3) == [2, 3] && [3, 1, 2].sort() == [1, 2, 3]",
    "sets.contains([1, 2, 3], [1, 2]) && sets.equivalent([1, 2], [2, 1]) && sets.intersects([1], [3, 1])",
    "!sets.contains([1], [1, 2]) && !sets.intersects([1], [2])",
    # standard CEL that cel-python itself evaluates
    "[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].filter(x, x > 1) == [2, 3]",
    "[1, 2, 3].all(x, x > 0) && [1, 2, 3].exists(x, x == 2) && [1, 2, 3].exists_one(x, x == 2)",
    'size("abc") == 3 && "abc".startsWith("a") && "abc".endsWith("c") && int("4") == 4 && string(4) == "4"',
    f'type(1) == int && type(device.attributes["{GPU}"].model) == string && type([]) == list',
    'timestamp("2024-05-01T10:00:00Z").getFullYear() == 2024 && duration("90s") == duration("1m30s")',
    "!(false && 1 / 0 == 1)",
    "1 / 0 == 1 || true",
]


@pytest.mark.parametrize("expression", LIBRARY)
def test_library(expression: str) -> None:
    assert device_matches(expression, A100) is True


@pytest.mark.parametrize(("expression", "words"), [
    ('quantity("Three") == quantity("3")', "is not a Kubernetes quantity"),
    ('quantity(" 1") == quantity("1")', "spaces"),
    ('quantity("1.5").asInteger() == 1', "cannot convert value to integer"),
    ('semver("v1.0.0") == semver("1.0.0")', "semver('v1.0.0')"),
    ('semver("1.0") == semver("1.0.0")', "no Major.Minor.Patch"),
    ('"abc".charAt(4) == ""', "index out of range: 4"),
    ('"abc".substring(2, 1) == ""', "invalid substring range"),
    ('"abc".matches(device.attributes["gpu.kubecell.io"].model + "(")', "invalid regular expression"),
    ("[].max() == 1", "empty list"),
    ('quantity("1").compareTo(semver("1.0.0")) == 0', "no such overload"),
    ("1 / 0 == 1", "divide by zero"),
    ('device.attributes["gpu.kubecell.io"].model', "must evaluate to bool, not string"),
])
def test_runtime_errors(expression: str, words: str) -> None:
    with pytest.raises(SelectorError) as raised:
        device_matches(expression, A100)
    assert raised.value.kind == "runtime"
    assert words in str(raised.value)
    assert "GPU-1" in str(raised.value)  # which device it failed on


_TEN = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"
EXPENSIVE = "".join(f"{_TEN}.all({v}, " for v in ("x", "y", "z", "z2", "z3", "z4", "z5")) + \
    "int('1'.find('[0-9]*')) < 100" + ")" * 7
"""compile_test.go's "expensive" case."""

REFUSED = [
    ("?!", "syntax", "syntax error at line 1, column 1"),
    ("1 +", "syntax", "syntax error at line 1, column 3"),
    ("device.attributes[?\"x\"].y", "syntax", "optional syntax"),
    ("1", "type", "must evaluate to bool or the unknown type, not int"),
    ("device.driver", "type", "must evaluate to bool or the unknown type, not string"),
    ('quantity("1")', "type", "not quantity"),
    ("device.attributes", "type", "not map"),
    ("foo(1)", "undeclared", "undeclared reference to 'foo' at line 1, column 1"),
    ("x == 1", "undeclared", "undeclared reference to 'x'"),
    ("device.nope == 1", "undeclared", "undefined field 'nope' of device"),
    ('ip("10.0.0.1").family() == 4', "unsupported", "'ip' is part of Kubernetes' CEL environment"),
    ('"%s".format(["a"]) == "a"', "unsupported", "'format'"),
    ("lists.range(3).size() == 3", "unsupported", "'lists.range' is not implemented"),
    ("[1].all(i, v, v > 0)", "unsupported", "two-variable comprehensions"),
    ("Message{a: 1} == 1", "unsupported", "message construction"),
    ('.size("a") == 1', "unsupported", "leading-dot function call"),
    ('"a".matches("(")', "syntax", "invalid regular expression '('"),
    ("9223372036854775808 == 1", "syntax", "invalid literal: overflow"),
    ("has(device) == true", "syntax", "has() takes one field selection"),
    ("(1).all(x, x)", "type", "iterates a list or a map, not a int"),
    (EXPENSIVE, "cost", "too complex, exceeds cost limit"),
    ("cel.bind(a, 'xxxxxxxxxxxxxxxx', " + "cel.bind(a, a + a, " * 20 + "size(a) > 0" + ")" * 21, "cost",
     "exceeds cost limit"),
    ("size(" * 45 + "'a'" + ")" * 45 + " > 0", "depth", "nested too deeply"),
    ("[" * 45 + "1" + "]" * 45 + " != []", "depth", "nested too deeply"),
]


@pytest.mark.parametrize(("expression", "kind", "words"), REFUSED, ids=[c[0][:50] for c in REFUSED])
def test_refusals(expression: str, kind: str, words: str) -> None:
    with pytest.raises(SelectorError) as raised:
        compile_selector(expression)
    assert raised.value.kind == kind
    assert words in str(raised.value)
    assert str(raised.value).startswith("CEL selector ")


def test_expensive_upstream_case_is_priced_close_to_cel_go() -> None:
    """cel-go estimates the seven nested ``all`` of compile_test.go's "expensive" case at 85,555,551."""
    with pytest.raises(SelectorError) as raised:
        compile_selector(EXPENSIVE)
    estimate = int(str(raised.value).split("worst case ")[1].split(",")[0])
    assert 80_000_000 < estimate < 90_000_000


def test_length_limit_counts_utf8_bytes() -> None:
    near = "true || " + '"' + "é" * ((MAX_EXPRESSION_BYTES - 20) // 2) + '" == ""'
    assert len(near.encode()) <= MAX_EXPRESSION_BYTES
    compile_selector(near)
    over = "true || " + '"' + "é" * (MAX_EXPRESSION_BYTES // 2) + '" == ""'
    assert len(over) < MAX_EXPRESSION_BYTES < len(over.encode())
    with pytest.raises(SelectorError, match="bytes long; Kubernetes accepts at most 10240") as raised:
        compile_selector(over)
    assert raised.value.kind == "length"


def test_long_logical_chains_are_balanced_not_refused() -> None:
    drivers = [f'device.driver == "d{i}"' for i in range(300)]
    assert device_matches(" || ".join(drivers), A100) is False
    assert device_matches(" || ".join([*drivers, f'device.driver == "{GPU}"']), A100) is True
    assert device_matches(" && ".join(["true"] * 300), A100) is True


def test_run_time_cost_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate bounds the work before it runs; the budget bounds it while it runs, as cel-go's."""
    assert MAX_COST == 1_000_000
    monkeypatch.setattr(cel_module, "MAX_COST", 50)
    selector = compile_selector("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5].all(y, x * y > 0))")
    with pytest.raises(SelectorError, match="actual cost limit exceeded"):
        selector.matches(CelDevice.of("budget.example.com"))


def test_compiled_once_and_refusals_cached() -> None:
    expression = f'device.attributes["{GPU}"].index == 3'
    assert compile_selector(expression) is compile_selector(expression)
    with pytest.raises(SelectorError) as first:
        compile_selector("nope()")
    with pytest.raises(SelectorError) as second:
        compile_selector("nope()")
    assert first.value is second.value


def test_not_a_string() -> None:
    with pytest.raises(SelectorError, match="a selector is a string"):
        compile_selector(42)  # type: ignore[arg-type]


def test_device_view() -> None:
    """Names without a domain take the driver's; an unknown domain reads as an empty map."""
    dev = CelDevice.of(GPU, {"model": "x", "other.io/flag": True}, {"memory": Decimal(1)})
    assert dev.attributes == ((f"{GPU}/model", "x"), ("other.io/flag", True))
    assert device_matches('device.attributes["other.io"].flag && size(device.attributes["none.io"]) == 0', dev)
    assert device_matches(f'has(device.attributes["{GPU}"].model) && !has(device.attributes["{GPU}"].nope)', dev)
    assert dev == CelDevice.of(GPU, {"other.io/flag": True, "model": "x"}, {"memory": Decimal(1)})
    assert isinstance(parse_semver("1.2.3-rc.1+b"), Semver)
    assert str(parse_semver("1.2.3-rc.1+b")) == "1.2.3-rc.1+b"
