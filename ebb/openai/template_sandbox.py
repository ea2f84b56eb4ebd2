"""The jinja environment chat templates run in: transformers' sandbox, with a budget.

jinja's ImmutableSandboxedEnvironment (what transformers renders templates in) keeps a
template from Python's internals and caps `range`, but not the work a template does:
nested loops, `'x' * 10**9`, a string doubled in a loop or a recursive macro each hold a
CPU (or the memory) for as long as they like. Here every such operation is charged to the
render's budget (`ebb.openai.template_budget`) before it runs:
- every for-loop iterates through `counted` (the parsed template is rewritten so), and a
  recursive loop's `loop(...)` call too;
- every call (macros, globals, methods) costs a step; macros nest at most MAX_MACRO_DEPTH;
- `+`, `*`, `%`, `**` and `~` are intercepted: the size of the string or list they would
  build is checked before it is built (and `**` / `*` on integers by their bits);
- filters are an allowlist, each charged a step, the ones that grow a string checked by
  their arguments first, and every result's size charged; str methods are an allowlist too.
"""

from __future__ import annotations

import functools
import string
import types
from collections.abc import Callable, Iterable
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import loopcontrols
from jinja2.filters import FILTERS, make_attrgetter
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg

from ebb.openai.template_budget import (
    LIST_ITEM_CHARS,
    MAX_MACRO_DEPTH,
    TemplateBudgetExceeded,
    counted,
    current,
)

_LOOP_FILTER = "ebb_counted"
_CONCAT_FILTER = "ebb_concat"
# Integers a template may make with `*` and `**` (far beyond any template's arithmetic).
_MAX_INT_BITS = 4096
# `%`-formatting and str.format: at most this many values, each width at most the limit.
_MAX_FORMAT_ARGS = 64


def _words(text: str) -> list[str]:
    return text.split()


# The filters real chat templates use; the rest (batch, slice, wordwrap, urlize, ...)
# build large values from small arguments and no template needs them.
_FILTERS = _words(
    "abs attr capitalize center count d default dictsort e escape first float "
    "forceescape format groupby indent int items join last length list lower map max "
    "min reject rejectattr replace reverse round safe select selectattr sort string "
    "sum title trim truncate unique upper wordcount"
)
# str methods a template may call: those that never grow a string, and (checked by their
# arguments) center, ljust, rjust, zfill, expandtabs, replace, join, format.
_STR_METHODS = frozenset(
    _words(
        "capitalize casefold count endswith find index isalnum isalpha isascii isdecimal "
        "isdigit isidentifier islower isnumeric isprintable isspace istitle isupper "
        "lower lstrip partition removeprefix removesuffix rfind rindex rpartition rsplit "
        "rstrip split splitlines startswith strip swapcase title upper center ljust "
        "rjust zfill expandtabs replace join format format_map"
    )
)


def chars_of(value: object) -> int:
    """What `value` is charged as: its length (a list's items LIST_ITEM_CHARS each)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple | dict):
        return len(value) * LIST_ITEM_CHARS
    return 0


def _text_size(value: object) -> int:
    """The length of str(value), without building it for a string."""
    return len(value) if isinstance(value, str) else len(str(value))


def _check_replace(s: object, old: object, new: object, count: object = -1) -> None:
    text, old_s, new_s = str(s), str(old), str(new)
    hits = len(text) + 1 if not old_s else text.count(old_s)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    current().size(len(text) + hits * max(0, len(new_s) - len(old_s)))


def _check_width(s: object, width: object) -> None:
    if isinstance(width, int):
        current().size(max(_text_size(s), width))


def _check_percent(fmt: str, values: object) -> None:
    """`fmt % values` builds at most what its values and widths add up to."""
    items = values if isinstance(values, tuple) else (values,)
    if len(items) > _MAX_FORMAT_ARGS:
        raise TemplateBudgetExceeded(f"more than {_MAX_FORMAT_ARGS} values to format")
    widths = _widths(fmt.replace("%%", ""), "%")
    current().size(len(fmt) + sum(map(_text_size, items)) + sum(widths))


def _check_format(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    values = (*args, *kwargs.values())
    if len(values) > _MAX_FORMAT_ARGS:
        raise TemplateBudgetExceeded(f"more than {_MAX_FORMAT_ARGS} values to format")
    widths = []
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if spec and "{" in spec:
            raise TemplateBudgetExceeded("a format width taken from a value")
        widths += _widths(spec or "", "")
    current().size(len(fmt) + sum(map(_text_size, values)) + sum(widths))


def _widths(fmt: str, marker: str) -> list[int]:
    """The numbers in a format's specs (widths and precisions): each at most the limit."""
    if marker and "*" in fmt:
        raise TemplateBudgetExceeded("a format width taken from a value")
    digits = "".join(c if c.isdigit() else " " for c in fmt).split()
    limit = current().limits.max_output_chars
    numbers = [int(d) if len(d) < 12 else limit + 1 for d in digits]
    for n in numbers:
        if n > limit:
            raise TemplateBudgetExceeded(f"a format width of {n:,} (at most {limit:,})")
    return numbers


def _check_join(items: list[Any], sep: object) -> None:
    current().size(sum(map(_text_size, items)) + _text_size(sep) * max(0, len(items) - 1))


def _check_int_bits(bits: int) -> None:
    if bits > _MAX_INT_BITS:
        raise TemplateBudgetExceeded(f"an integer of more than {_MAX_INT_BITS} bits")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    budget = current()
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "*" and ints:
        _check_int_bits(abs(left).bit_length() + abs(right).bit_length())
    elif operator == "*":
        seq, times = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(times, int) and isinstance(seq, str | list | tuple):
            budget.size(chars_of(seq) * max(0, times))
    elif operator == "+" and isinstance(left, str | list | tuple):
        budget.size(chars_of(left) + chars_of(right))
    elif operator == "%" and isinstance(left, str):
        _check_percent(left, right)
    elif operator == "**" and ints and right > 0:
        _check_int_bits(max(1, abs(left).bit_length()) * right)


def _counted_filter(value: Iterable[object]) -> Iterable[object]:
    return counted(value)


def _concat(values: list[object]) -> str:
    """`a ~ b ~ c`: its size checked before it is joined."""
    pieces = [str(v) for v in values]
    current().size(sum(map(len, pieces)))
    return "".join(pieces)


def _sum_numbers(pieces: list[Any], start: object) -> None:
    numbers = all(isinstance(v, int | float) for v in (*pieces, start))
    if not numbers:  # sum of lists is quadratic, and no template sums anything else
        raise TemplateBudgetExceeded("sum over values that are not numbers")


# Checks run before the filter, on (value, its other arguments, keyword arguments).
_FILTER_CHECKS: dict[str, Callable[[Any, tuple[Any, ...], dict[str, Any]], None]] = {
    "center": lambda v, a, k: _check_width(v, a[0] if a else k.get("width", 80)),
    "indent": lambda v, a, k: _check_width(
        v, _text_size(v) + (str(v).count("\n") + 1) * _indent_size(a[0] if a else k.get("width"))
    ),
    "replace": lambda v, a, k: _check_replace(v, *a, **k),
    "format": lambda v, a, k: _check_percent(str(v), tuple(k.values()) or a),
    "tojson": lambda v, a, k: _check_indent(k.get("indent", a[1] if len(a) > 1 else None)),
}


def _indent_size(width: object) -> int:
    return 4 if width is None else width if isinstance(width, int) else len(str(width))


def _check_indent(indent: object) -> None:
    if isinstance(indent, int) and indent > 16:
        raise TemplateBudgetExceeded(f"tojson indent of {indent} (at most 16)")


def _join_separator(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    return kwargs.get("d", args[2] if len(args) > 2 else "")


def _joined_values(args: tuple[Any, ...], kwargs: dict[str, Any], items: list[Any]) -> list[Any]:
    """What `join` (eval_ctx, value, d, attribute) joins: the items, or their attribute."""
    attribute = kwargs.get("attribute", args[3] if len(args) > 3 else None)
    if attribute is None:
        return items
    getter = make_attrgetter(args[0].environment, attribute)
    return [getter(item) for item in items]


def _budgeted_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    takes = 1 if _PassArg.from_obj(func) is not None else 0
    check = _FILTER_CHECKS.get(name)

    @functools.wraps(func)
    def budgeted(*args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.step()
        if name in ("join", "sum") and len(args) > takes:  # materialised once, checked
            items = list(args[takes])
            if name == "join":
                _check_join(_joined_values(args, kwargs, items), _join_separator(args, kwargs))
            if name == "sum":
                start = kwargs.get("start", args[takes + 2] if len(args) > takes + 2 else 0)
                given = args[takes + 1] if len(args) > takes + 1 else None
                attribute = kwargs.get("attribute", given)
                _sum_numbers([] if attribute is not None else items, start)
            args = (*args[:takes], items, *args[takes + 1 :])
        elif check is not None and len(args) > takes:
            check(args[takes], args[takes + 1 :], kwargs)
        result = func(*args, **kwargs)
        budget.size(chars_of(result))
        return result

    return budgeted


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """transformers' environment (trim_blocks, lstrip_blocks, loop controls), budgeted."""

    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        self.globals.pop("lipsum", None)  # lipsum(n=10**9): work from a small argument
        self.filters = {name: _budgeted_filter(name, FILTERS[name]) for name in _FILTERS}
        self.filters[_LOOP_FILTER] = _counted_filter
        self.filters[_CONCAT_FILTER] = _concat

    def add_filter(self, name: str, func: Callable[..., Any]) -> None:
        self.filters[name] = _budgeted_filter(name, func)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        _rewrite(tree)
        return tree

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        current().step()
        _check_binop(operator, left, right)
        return self.binop_table[operator](left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = current()
        budget.step()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (counted(args[0]), *args[1:])
        args = _check_str_method(__obj, args, kwargs)
        if not isinstance(__obj, Macro):
            result = super().call(__context, __obj, *args, **kwargs)
        else:
            if budget.macro_depth >= MAX_MACRO_DEPTH:
                raise TemplateBudgetExceeded(f"macros nested more than {MAX_MACRO_DEPTH} deep")
            budget.macro_depth += 1
            try:
                result = super().call(__context, __obj, *args, **kwargs)
            finally:
                budget.macro_depth -= 1
        budget.size(chars_of(result))
        return result


def _check_str_method(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """`args`, once `obj` is checked: a str method is one of _STR_METHODS, and one that
    grows a string is checked by its arguments before it runs (str.format arrives as the
    sandbox's wrapper of it; str.join's iterable is materialised to be measured)."""
    method = getattr(obj, "__wrapped__", obj)
    owner = getattr(method, "__self__", None)
    if not isinstance(owner, str) or not isinstance(
        method, types.BuiltinMethodType | types.MethodType
    ):
        return args
    name = method.__name__
    # jinja's own bookkeeping, which Context.call takes out again before the call.
    kwargs = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}
    if name not in _STR_METHODS:
        raise SecurityError(f"a chat template may not call str.{name}()")
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _check_width(owner, args[0])
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        _check_width(owner, len(owner) + owner.count("\t") * tab if isinstance(tab, int) else 0)
    elif name == "replace":
        _check_replace(owner, *args, **kwargs)
    elif name == "join" and args:
        items = list(args[0])
        _check_join(items, owner)
        return (items, *args[1:])
    elif name == "format":
        _check_format(owner, args, kwargs)
    elif name == "format_map" and args and isinstance(args[0], dict):
        _check_format(owner, (), args[0])
    return args


def _rewrite(node: nodes.Node) -> nodes.Node:
    """Every for-loop's iterable through the step counter, every `~` through `_concat`."""
    for field, value in node.iter_fields():
        if isinstance(value, list):
            setattr(node, field, [_rewrite(v) if isinstance(v, nodes.Node) else v for v in value])
        elif isinstance(value, nodes.Node):
            setattr(node, field, _rewrite(value))
    if isinstance(node, nodes.For):
        node.iter = _filter(node.iter, _LOOP_FILTER, node.lineno)
    elif isinstance(node, nodes.Concat):
        return _filter(nodes.List(node.nodes, lineno=node.lineno), _CONCAT_FILTER, node.lineno)
    return node


def _filter(node: nodes.Node, name: str, lineno: int) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=lineno)
