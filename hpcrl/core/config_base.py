"""What every config section shares: the error type for user mistakes, documented fields, the
check that raises one, and reading the YAML a user wrote. Pure Python (every rank and `hpcrl plan`
read configs)."""
from __future__ import annotations

import dataclasses
import math
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import yaml


class ConfigError(ValueError):
    """A user mistake in the config; the message says where, what, and what would be valid."""


@dataclass(frozen=True)
class Range:
    """The values a numeric config key may take: from `low` (above it, when `above`) to `high`
    (below it, when `below`), either end open when None; a null value passes (a key that may be
    null says so in its type).
    `words`: what the message says is expected, where the default phrasing would not do."""

    low: float | None = None
    high: float | None = None
    above: bool = False
    words: str = ""
    below: bool = False

    def holds(self, value: Any) -> bool:
        return (value is None or (self.low is None or (value > self.low if self.above else value >= self.low))
                and (self.high is None or (value < self.high if self.below else value <= self.high)))

    def expected(self) -> str:
        if self.words:
            return self.words
        if self.low is not None and self.high is not None:
            return f"a number in {'(' if self.above else '['}{self.low:g}, {self.high:g}{')' if self.below else ']'}"
        return f"a number {'>' if self.above else '>='} {self.low:g}" if self.low is not None else f"<= {self.high:g}"


@dataclass(frozen=True)
class OneOf:
    """The values a config key that names a choice may take (null too, when `null`)."""

    choices: tuple
    null: bool = False

    def holds(self, value: Any) -> bool:
        return (value is None and self.null) or value in self.choices

    def expected(self) -> str:
        return ("null or " if self.null else "") + "one of " + ", ".join(str(c) for c in self.choices)


POSITIVE = Range(0, above=True)  # > 0
NON_NEGATIVE = Range(0, words=">= 0")
FRACTION = Range(0, 1)  # in [0, 1]
AT_LEAST_ONE = Range(1, words=">= 1")


def doc(text: str, reads: tuple[str, ...] = (), range: Range | OneOf | None = None, **kwargs: Any) -> Any:  # noqa: A002
    """A dataclass field with its one-line documentation attached. `reads`: for a key of the algo
    section that not every algorithm reads, the groups of algorithms that do (core/dataflow.py
    `Algorithm.reads`); a config that sets it for another algorithm is refused. `range`: the values
    it may take (a Range, or a OneOf for a choice), which `check_ranges` checks."""
    return field(metadata={"doc": text, "reads": reads, "range": range}, **kwargs)


def check_ranges(section: Any, where: str) -> None:
    """A ConfigError for the first field of the dataclass `section` (at `where`, e.g. 'algo') whose
    value is outside the range its declaration gives: one checker for every declared range."""
    for f in dataclasses.fields(section):
        wanted = f.metadata.get("range")
        value = getattr(section, f.name)
        check(wanted is None or wanted.holds(value),
              lambda: f"{where}.{f.name}: expected {wanted.expected()}, got {shown(value)}")


def check(cond: bool, message: Union[str, Callable[[], str]]) -> None:
    """Raise a ConfigError with `message` unless `cond`. A message that shows a user's value of any
    size (a list, a mapping, a string) is passed as a callable, built only when the check fails:
    a config's values can be huge (YAML aliases share one object many times over)."""
    if not cond:
        raise ConfigError(message() if callable(message) else message)


class _BoundedRepr(reprlib.Repr):
    """reprlib's bounded repr, which walks only the items it prints, and never fails on an integer
    too long to print (Python refuses str() of integers over 4,300 digits)."""

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 3, 8, 8, 8, 8
        self.maxstring, self.maxother, self.maxlong = 80, 80, 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"a {x.bit_length():,}-bit integer"
        return super().repr_int(x, level)


SHOWN_CHARS = 300  # the most characters of a user's value an error message prints
_bounded = _BoundedRepr()


def is_number(v: Any) -> bool:
    """A finite int or float as YAML gives it (not a bool, which Python counts as an int)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def number_as_text_hint(value: Any, integer: bool = False) -> str:
    """YAML 1.1 reads 3e-5 as a string (it wants a dot: 3.0e-5): the hint an error message about
    `value`, which should have been a number (an integer with `integer`), ends with; empty for any
    other value."""
    try:
        parsed = float(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if not is_number(parsed):
        return ""
    if integer:
        whole = f"write it as {int(parsed)}" if parsed == int(parsed) else "an integer is expected here"
        return f" (YAML reads {value} as text; {whole})"
    return f" (YAML reads {value} as text; write it as {_yaml_float(value.strip())})"


def _yaml_float(text: str) -> str:
    """`text` as YAML 1.1 reads a float: a dot in the mantissa and a sign in the exponent
    ('3e-4' -> '3.0e-4', '1e6' -> '1.0e+6')."""
    found = re.fullmatch(r"([-+]?)(\d*\.?\d*)[eE]([-+]?)(\d+)", text)
    if found is None:
        return repr(float(text))
    sign, mantissa, exp_sign, exponent = found.groups()
    mantissa = mantissa if "." in mantissa else f"{mantissa}.0"
    return f"{sign}{mantissa}e{exp_sign or '+'}{exponent}"


def shown(value: Any) -> str:
    """A user's value as an error message shows it: its repr, cut short for big values."""
    text = _bounded.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


# --- reading YAML a user wrote: safely, and refusing what yaml.safe_load lets through silently ---

MAX_YAML_VALUES = 100_000  # values a config holds once its aliases are expanded; real ones hold hundreds
MAX_INT_CHARS = 100  # an integer literal longer than this is no config value (they fit 64 bits: 20 digits)
_MERGE = "tag:yaml.org,2002:merge"  # `<<: *base` takes base's keys; the mapping's own keys override them
_INT = "tag:yaml.org,2002:int"


def load_yaml(text: str, source: str) -> Any:
    """One YAML document of a config, safe-loaded, or None when it is empty. A ConfigError (naming
    `source`, the line and the key) when it is no valid YAML, gives a key twice in one mapping
    (safe_load keeps the last quietly), holds more than MAX_YAML_VALUES values once its aliases are
    expanded (a "billion laughs" would exhaust memory in whatever walks it), or an alias inside the
    value it names, or an integer literal longer than MAX_INT_CHARS."""
    try:
        return load_bounded_yaml(text, source)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {yaml_problem(exc)}") from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line, where it is: 'line 2, column 7: expected ',' or ']', but got
    '<stream end>' (in a flow sequence that starts at line 2, column 7)'. PyYAML's own text spans
    several lines, names the text '<unicode string>' and draws carets under copies of it."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    mark = exc.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if exc.context:
        context = "in " + exc.context.removeprefix("while ").removeprefix("parsing ").removeprefix("scanning ")
        begun = exc.context_mark
        if begun is not None and (begun.line, begun.column) != (mark.line, mark.column):
            context += f" that starts at line {begun.line + 1}, column {begun.column + 1}"
        text += f" ({context})"
    return text


def load_bounded_yaml(text: str, source: str) -> Any:
    """`load_yaml` for callers that word a syntax error themselves (`hpcrl inspect` on a run
    directory's config.yaml): yaml.YAMLError for YAML that does not parse, ConfigError for the
    rest of load_yaml's refusals."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _YamlGraph(loader, source).size(node, "")
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{source}: not valid YAML for a config: its values are nested too deeply") from None
    finally:
        loader.dispose()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _YamlGraph:
    """Walks a composed YAML document once per node (an alias is the node it names), counting the
    values each node holds once expanded, and checking every mapping's keys."""

    def __init__(self, loader: yaml.SafeLoader, source: str):
        self.loader, self.source = loader, source
        self.sizes: dict[int, int] = {}
        self.walking: set[int] = set()

    def size(self, node: yaml.Node, path: str) -> int:
        key = id(node)
        if key in self.sizes:
            return self.sizes[key]
        where = f"{self.source}: line {_line(node)}: {path or 'the config'}"
        if key in self.walking:
            raise ConfigError(f"{where}: holds an alias (*name) of itself, a value without end; write it out")
        if isinstance(node, yaml.ScalarNode):
            check(node.tag != _INT or len(node.value) <= MAX_INT_CHARS,
                  lambda: f"{where}: an integer of {len(node.value):,} characters; config integers fit 64 bits")
            self.sizes[key] = 1
            return 1
        self.walking.add(key)
        if isinstance(node, yaml.SequenceNode):
            children = [(child, f"{path}[{i}]") for i, child in enumerate(node.value)]
        else:
            children = [(k, path) for k, _ in node.value]
            children += [(v, _join(path, str(k.value)) if isinstance(k, yaml.ScalarNode) else path)
                         for k, v in node.value]
        total = 1
        for child, child_path in children:
            total += self.size(child, child_path)
            check(total <= MAX_YAML_VALUES,
                  lambda: f"{where}: holds more than {MAX_YAML_VALUES:,} values once its aliases (*name) are "
                          f"expanded; no config needs that many: write the values out instead of aliasing them")
        if isinstance(node, yaml.MappingNode):
            self._check_keys(node, path)
        self.walking.discard(key)
        self.sizes[key] = total
        return total

    def _check_keys(self, node: yaml.MappingNode, path: str) -> None:
        first_of: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE or not isinstance(key_node, yaml.ScalarNode):
                continue  # merged keys may be overridden; a non-scalar key is refused when constructed
            first = first_of.setdefault(self.loader.construct_object(key_node), key_node)
            check(first is key_node,
                  lambda: f"{self.source}: {_join(path, str(key_node.value))}: given twice, at lines {_line(first)} "
                          f"and {_line(key_node)} (YAML would quietly keep the last); keep one")
