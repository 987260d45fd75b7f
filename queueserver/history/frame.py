"""Column expressions and frames that run on two engines: Spark, and plain Python.

The history's state, tables, summary and report series are written once,
against this module (:mod:`.state`, :mod:`.tables`, :mod:`.summary`,
:mod:`.report`). Each expression can become a Spark ``Column``
(:meth:`Expr.spark`, used by :class:`.sparkframe.SparkFrame`) or a Python
function of one row (:meth:`Expr.py`, used by :class:`RowFrame`, which holds
rows as dicts). So the Python engine, which spares a small history Spark's
start-up, computes the very definitions Spark computes: the two cannot
drift apart, and tests/test_history_engines.py checks that they agree.

The Python side follows Spark SQL's semantics where they matter here:
null in, null out; a comparison with null is null and ``when`` takes null
for false; ``&``/``|`` are three-valued; aggregates skip nulls (``min``,
``max`` and ``sum`` of nothing are null, ``count_if`` counts the true);
structs (dicts here) compare field by field, null first. A percentile is
the value at the nearest rank, ``sorted[ceil(p * n) - 1]``: what Spark's
``percentile_approx`` gives while a group holds up to 10,000 values (its
relative rank error is 1/10,000; beyond that it may pick a neighbour).

Nothing here imports pyspark until :meth:`Expr.spark` is called.

Why one module, though over 600 lines: each expression keeps its Spark and
its Python side in one class, so that they cannot drift apart, and the
plain-Python frame that evaluates them (:class:`RowFrame`) sits beside them,
as :mod:`.sparkframe` sits beside Spark.
"""
from __future__ import annotations

import math
import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

from .columns import Schema, names

Row = Dict[str, Any]
Fn = Callable[[Row], Any]
EPOCH_DAY = date(1970, 1, 1)


def _functions() -> Any:
    from pyspark.sql import functions
    return functions


# ------------------------------------------------------------------ expressions
class Expr(ABC):
    """A column expression. Operators build new ones: ``+ - / %`` and comparisons
    (``==`` included: an Expr is never a dict key), ``&``, ``|`` and ``~``."""

    @abstractmethod
    def py(self) -> Fn:
        """A function of one row (a dict) that computes the expression."""

    @abstractmethod
    def spark(self) -> Any:   # -> pyspark.sql.Column
        """The same expression as a Spark column."""

    def alias(self, name: str) -> "Named":
        return Named(name, self)

    # Arithmetic and comparisons: null if either side is null.
    def __add__(self, other: object) -> "Expr":
        return _Binary("+", operator.add, self, _expr(other))

    def __sub__(self, other: object) -> "Expr":
        return _Binary("-", operator.sub, self, _expr(other))

    def __truediv__(self, other: object) -> "Expr":
        return _Binary("/", operator.truediv, self, _expr(other))

    def __lt__(self, other: object) -> "Expr":
        return _Binary("<", operator.lt, self, _expr(other))

    def __le__(self, other: object) -> "Expr":
        return _Binary("<=", operator.le, self, _expr(other))

    def __gt__(self, other: object) -> "Expr":
        return _Binary(">", operator.gt, self, _expr(other))

    def __ge__(self, other: object) -> "Expr":
        return _Binary(">=", operator.ge, self, _expr(other))

    def __eq__(self, other: object) -> "Expr":   # type: ignore[override]
        return _Binary("==", operator.eq, self, _expr(other))

    def __ne__(self, other: object) -> "Expr":   # type: ignore[override]
        return _Binary("!=", operator.ne, self, _expr(other))

    __hash__ = None   # type: ignore[assignment]

    def __and__(self, other: "Expr") -> "Expr":
        return _And(self, other)

    def __or__(self, other: "Expr") -> "Expr":
        return _Or(self, other)

    def __invert__(self) -> "Expr":
        return _Not(self)

    def isin(self, *values: object) -> "Expr":
        return _IsIn(self, tuple(values))

    def is_null(self) -> "Expr":
        return _IsNull(self, True)

    def is_not_null(self) -> "Expr":
        return _IsNull(self, False)

    def field(self, name: str) -> "Expr":
        """A struct's field (null when the struct is)."""
        return _Field(self, name)

    def item(self, index: int) -> "Expr":
        """An array's element (null when the array is)."""
        return _Item(self, index)

    def to_int(self) -> "Expr":
        """A 32-bit int (Spark's ``cast("int")``)."""
        return _Cast(self, "int", int)


def _expr(value: object) -> Expr:
    return value if isinstance(value, Expr) else Lit(value)


@dataclass(frozen=True, eq=False)
class Named:
    """An expression with the name of the column it makes."""
    name: str
    expr: Expr


class Col(Expr):
    def __init__(self, name: str) -> None:
        self.name = name

    def py(self) -> Fn:
        name = self.name
        return lambda row: row[name]

    def spark(self) -> Any:
        return _functions().col(self.name)


class Lit(Expr):
    def __init__(self, value: object) -> None:
        self.value = value

    def py(self) -> Fn:
        value = self.value
        return lambda row: value

    def spark(self) -> Any:
        return _functions().lit(self.value)


def col(name: str) -> Expr:
    return Col(name)


def lit(value: object) -> Expr:
    return Lit(value)


class _Binary(Expr):
    def __init__(self, symbol: str, op: Callable[[Any, Any], Any], left: Expr, right: Expr) -> None:
        self.symbol, self.op, self.left, self.right = symbol, op, left, right

    def py(self) -> Fn:
        op, left, right = self.op, self.left.py(), self.right.py()

        def apply(row: Row) -> Any:
            a, b = left(row), right(row)
            return None if a is None or b is None else op(a, b)
        return apply

    def spark(self) -> Any:
        left, right = self.left.spark(), self.right.spark()
        return {"+": operator.add, "-": operator.sub, "/": operator.truediv, "<": operator.lt,
                "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
                "!=": operator.ne}[self.symbol](left, right)


class _And(Expr):
    def __init__(self, left: Expr, right: Expr) -> None:
        self.left, self.right = left, right

    def py(self) -> Fn:
        left, right = self.left.py(), self.right.py()

        def both(row: Row) -> Optional[bool]:
            a, b = left(row), right(row)
            if a is False or b is False:
                return False
            return None if a is None or b is None else True
        return both

    def spark(self) -> Any:
        return self.left.spark() & self.right.spark()


class _Or(Expr):
    def __init__(self, left: Expr, right: Expr) -> None:
        self.left, self.right = left, right

    def py(self) -> Fn:
        left, right = self.left.py(), self.right.py()

        def either(row: Row) -> Optional[bool]:
            a, b = left(row), right(row)
            if a is True or b is True:
                return True
            return None if a is None or b is None else False
        return either

    def spark(self) -> Any:
        return self.left.spark() | self.right.spark()


class _Not(Expr):
    def __init__(self, inner: Expr) -> None:
        self.inner = inner

    def py(self) -> Fn:
        inner = self.inner.py()

        def negate(row: Row) -> Optional[bool]:
            value = inner(row)
            return None if value is None else not value
        return negate

    def spark(self) -> Any:
        return ~self.inner.spark()


class _IsIn(Expr):
    def __init__(self, inner: Expr, values: Tuple[object, ...]) -> None:
        self.inner, self.values = inner, values

    def py(self) -> Fn:
        inner, values = self.inner.py(), frozenset(self.values)

        def member(row: Row) -> Optional[bool]:
            value = inner(row)
            return None if value is None else value in values
        return member

    def spark(self) -> Any:
        return self.inner.spark().isin(*self.values)


class _IsNull(Expr):
    def __init__(self, inner: Expr, null: bool) -> None:
        self.inner, self.null = inner, null

    def py(self) -> Fn:
        inner, null = self.inner.py(), self.null
        return lambda row: (inner(row) is None) == null

    def spark(self) -> Any:
        inner = self.inner.spark()
        return inner.isNull() if self.null else inner.isNotNull()


class _Field(Expr):
    def __init__(self, struct: Expr, name: str) -> None:
        self.struct, self.name = struct, name

    def py(self) -> Fn:
        struct, name = self.struct.py(), self.name

        def get(row: Row) -> Any:
            value = struct(row)
            return None if value is None else value[name]
        return get

    def spark(self) -> Any:
        return self.struct.spark().getField(self.name)


class _Item(Expr):
    def __init__(self, array: Expr, index: int) -> None:
        self.array, self.index = array, index

    def py(self) -> Fn:
        array, index = self.array.py(), self.index

        def get(row: Row) -> Any:
            value = array(row)
            return None if value is None else value[index]
        return get

    def spark(self) -> Any:
        return self.array.spark().getItem(self.index)


class _Cast(Expr):
    def __init__(self, inner: Expr, type_name: str, convert: Callable[[Any], Any]) -> None:
        self.inner, self.type_name, self.convert = inner, type_name, convert

    def py(self) -> Fn:
        inner, convert = self.inner.py(), self.convert

        def cast(row: Row) -> Any:
            value = inner(row)
            return None if value is None else convert(value)
        return cast

    def spark(self) -> Any:
        return self.inner.spark().cast(self.type_name)


class When(Expr):
    """``when(cond, value).when(...).otherwise(value)``: the first true condition's value,
    else the otherwise value (null without one)."""

    def __init__(self, branches: Tuple[Tuple[Expr, Expr], ...], default: Optional[Expr] = None) -> None:
        self.branches, self.default = branches, default

    def when(self, cond: Expr, value: object) -> "When":
        return When(self.branches + ((cond, _expr(value)),), self.default)

    def otherwise(self, value: object) -> "When":
        return When(self.branches, _expr(value))

    def py(self) -> Fn:
        branches = [(cond.py(), value.py()) for cond, value in self.branches]
        default = self.default.py() if self.default is not None else None

        def choose(row: Row) -> Any:
            for cond, value in branches:
                if cond(row) is True:
                    return value(row)
            return None if default is None else default(row)
        return choose

    def spark(self) -> Any:
        F = _functions()
        (cond, value), *rest = self.branches
        column = F.when(cond.spark(), value.spark())
        for cond, value in rest:
            column = column.when(cond.spark(), value.spark())
        return column if self.default is None else column.otherwise(self.default.spark())


def when(cond: Expr, value: object) -> When:
    return When(((cond, _expr(value)),))


class _Coalesce(Expr):
    def __init__(self, items: Tuple[Expr, ...]) -> None:
        self.items = items

    def py(self) -> Fn:
        items = [item.py() for item in self.items]

        def first(row: Row) -> Any:
            for item in items:
                value = item(row)
                if value is not None:
                    return value
            return None
        return first

    def spark(self) -> Any:
        return _functions().coalesce(*[item.spark() for item in self.items])


def coalesce(*items: object) -> Expr:
    return _Coalesce(tuple(_expr(item) for item in items))


class _Struct(Expr):
    def __init__(self, fields: Tuple[Named, ...]) -> None:
        self.fields = fields

    def py(self) -> Fn:
        fields = [(f.name, f.expr.py()) for f in self.fields]
        return lambda row: {name: fn(row) for name, fn in fields}

    def spark(self) -> Any:
        return _functions().struct(*[f.expr.spark().alias(f.name) for f in self.fields])


def struct(*fields: Named) -> Expr:
    """A struct of named fields, in order (a dict on the Python side)."""
    return _Struct(fields)


class _PMod(Expr):
    def __init__(self, inner: Expr, divisor: int) -> None:
        self.inner, self.divisor = inner, divisor

    def py(self) -> Fn:
        inner, divisor = self.inner.py(), self.divisor

        def mod(row: Row) -> Any:
            value = inner(row)
            return None if value is None else value % divisor
        return mod

    def spark(self) -> Any:
        F = _functions()
        return F.pmod(self.inner.spark(), F.lit(self.divisor))


def floor_to(inner: Expr, width: int) -> Expr:
    """``inner`` (µs) rounded down to a multiple of ``width``: its minute, its bucket."""
    return inner - _PMod(inner, width)


class _DayOf(Expr):
    """The UTC date of a time in µs (a ``date``; Spark's DateType)."""

    def __init__(self, inner: Expr, day_us: int) -> None:
        self.inner, self.day_us = inner, day_us

    def py(self) -> Fn:
        inner, day_us = self.inner.py(), self.day_us

        def day(row: Row) -> Optional[date]:
            value = inner(row)
            return None if value is None else EPOCH_DAY + timedelta(days=value // day_us)
        return day

    def spark(self) -> Any:
        F = _functions()
        days = (floor_to(self.inner, self.day_us).spark() / F.lit(self.day_us)).cast("int")
        return F.date_from_unix_date(days)


def day_of(inner: Expr, day_us: int) -> Expr:
    return _DayOf(inner, day_us)


# ------------------------------------------------------------------ aggregates
class Agg(ABC):
    """An aggregate over a group's rows."""

    def alias(self, name: str) -> "NamedAgg":
        return NamedAgg(name, self)

    @abstractmethod
    def spark(self) -> Any:
        """The same aggregate as a Spark column."""

    @abstractmethod
    def reducer(self) -> Callable[[List[Row]], Any]:
        """The Python function of a group's rows."""


@dataclass(frozen=True, eq=False)
class NamedAgg:
    name: str
    agg: Agg


def order_key(value: Any) -> Any:
    """Spark's ascending order as a Python key: null first, structs (dicts) field by field."""
    if value is None:
        return (0,)
    if isinstance(value, dict):
        return (1, tuple(order_key(v) for v in value.values()))
    return (1, value)


class _Extreme(Agg):
    def __init__(self, inner: Expr, smallest: bool) -> None:
        self.inner, self.smallest = inner, smallest

    def spark(self) -> Any:
        F = _functions()
        return (F.min if self.smallest else F.max)(self.inner.spark())

    def reducer(self) -> Callable[[List[Row]], Any]:
        inner, pick = self.inner.py(), (min if self.smallest else max)

        def extreme(rows: List[Row]) -> Any:
            values = [v for v in map(inner, rows) if v is not None]
            return pick(values, key=order_key) if values else None
        return extreme


def min_(inner: Expr) -> Agg:
    return _Extreme(inner, True)


def max_(inner: Expr) -> Agg:
    return _Extreme(inner, False)


class _Sum(Agg):
    def __init__(self, inner: Expr) -> None:
        self.inner = inner

    def spark(self) -> Any:
        return _functions().sum(self.inner.spark())

    def reducer(self) -> Callable[[List[Row]], Any]:
        inner = self.inner.py()

        def total(rows: List[Row]) -> Any:
            values = [v for v in map(inner, rows) if v is not None]
            return sum(values) if values else None
        return total


def sum_(inner: Expr) -> Agg:
    return _Sum(inner)


class _Count(Agg):
    def spark(self) -> Any:
        F = _functions()
        return F.count(F.lit(1))

    def reducer(self) -> Callable[[List[Row]], Any]:
        return len


def count() -> Agg:
    """The number of rows."""
    return _Count()


class _CountIf(Agg):
    def __init__(self, cond: Expr) -> None:
        self.cond = cond

    def spark(self) -> Any:
        return _functions().count_if(self.cond.spark())

    def reducer(self) -> Callable[[List[Row]], Any]:
        cond = self.cond.py()
        return lambda rows: sum(1 for row in rows if cond(row) is True)


def count_if(cond: Expr) -> Agg:
    return _CountIf(cond)


def nearest_rank(ordered: Sequence[float], p: float) -> float:
    """The p-quantile of sorted values at the nearest rank (see the module's docstring)."""
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


class _Percentiles(Agg):
    def __init__(self, inner: Expr, ps: Tuple[float, ...]) -> None:
        self.inner, self.ps = inner, ps

    def spark(self) -> Any:
        return _functions().percentile_approx(self.inner.spark(), list(self.ps))

    def reducer(self) -> Callable[[List[Row]], Any]:
        inner, ps = self.inner.py(), self.ps

        def quantiles(rows: List[Row]) -> Optional[List[float]]:
            values = sorted(float(v) for v in map(inner, rows) if v is not None)
            return [nearest_rank(values, p) for p in ps] if values else None
        return quantiles


def percentiles(inner: Expr, ps: Sequence[float]) -> Agg:
    """The ``ps`` quantiles of ``inner`` (a list; null for a group without values)."""
    return _Percentiles(inner, tuple(ps))


# ------------------------------------------------------------------ frames
Column = Union[str, Named]


@dataclass(frozen=True)
class Sort:
    """An ordering key: ascending with nulls first, or descending with nulls last (Spark's defaults)."""
    name: str
    descending: bool = False


def desc(name: str) -> Sort:
    return Sort(name, True)


class Frame(Protocol):
    """What the shared definitions ask of a frame; :class:`RowFrame` and
    :class:`.sparkframe.SparkFrame` answer alike."""

    @property
    def columns(self) -> List[str]: ...

    def select(self, *columns: Column) -> "Frame": ...

    def with_column(self, name: str, expr: Expr) -> "Frame": ...

    def drop(self, *names: str) -> "Frame": ...

    def where(self, cond: Expr) -> "Frame": ...

    def group_by(self, *keys: Column) -> "Grouped": ...

    def join(self, other: "Frame", on: Sequence[str], how: str) -> "Frame": ...

    def union(self, other: "Frame") -> "Frame": ...

    def fill_zero(self, names: Sequence[str]) -> "Frame": ...

    def order_by(self, *keys: Union[str, Sort]) -> "Frame": ...

    def limit(self, n: int) -> "Frame": ...

    def conform(self, schema: Schema) -> "Frame":
        """The columns of ``schema``, in its order and of its types."""

    def collect(self) -> List[Row]: ...


class Grouped(Protocol):
    def agg(self, *aggs: NamedAgg) -> Frame: ...


def _named(column: Column) -> Named:
    return column if isinstance(column, Named) else Named(column, Col(column))


def sort_key(keys: Sequence[Sort]) -> Callable[[Row], Any]:
    """Spark's order as one Python key: descending keys reverse their field's order."""
    def key(row: Row) -> Tuple[Any, ...]:
        return tuple(_Reversed(order_key(row[k.name])) if k.descending else order_key(row[k.name])
                     for k in keys)
    return key


class _Reversed:
    """A key that sorts in the opposite order (null last, then, as Spark's ``desc``)."""
    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: "_Reversed") -> bool:
        return bool(other.key < self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and bool(self.key == other.key)

    __hash__ = None   # type: ignore[assignment]


class RowFrame:
    """A frame of rows held in this process, each a dict: the Python engine."""

    def __init__(self, rows: List[Row], columns: Sequence[str]) -> None:
        self.rows = rows
        self._columns = list(columns)

    @property
    def columns(self) -> List[str]:
        return list(self._columns)

    def select(self, *columns: Column) -> "RowFrame":
        named = [_named(c) for c in columns]
        fns = [(n.name, n.expr.py()) for n in named]
        return RowFrame([{name: fn(row) for name, fn in fns} for row in self.rows],
                        [n.name for n in named])

    def with_column(self, name: str, expr: Expr) -> "RowFrame":
        fn = expr.py()
        rows = [{**row, name: fn(row)} for row in self.rows]
        return RowFrame(rows, self._columns + ([] if name in self._columns else [name]))

    def drop(self, *names: str) -> "RowFrame":
        gone = set(names)
        kept = [c for c in self._columns if c not in gone]
        return RowFrame([{c: row[c] for c in kept} for row in self.rows], kept)

    def where(self, cond: Expr) -> "RowFrame":
        fn = cond.py()
        return RowFrame([row for row in self.rows if fn(row) is True], self._columns)

    def group_by(self, *keys: Column) -> "RowGroups":
        return RowGroups(self, [_named(k) for k in keys])

    def join(self, other: Frame, on: Sequence[str], how: str) -> "RowFrame":
        """An equi-join on ``on`` ("outer" or "left"); null keys never match, as in SQL."""
        assert isinstance(other, RowFrame) and how in ("outer", "left"), how
        right_columns = [c for c in other.columns if c not in on]
        index: Dict[Tuple[Any, ...], List[Row]] = {}
        for row in other.rows:
            key = tuple(row[k] for k in on)
            if None not in key:
                index.setdefault(key, []).append(row)
        out: List[Row] = []
        matched = set()
        blank_right = {c: None for c in right_columns}
        for row in self.rows:
            key = tuple(row[k] for k in on)
            partners = index.get(key, []) if None not in key else []
            if partners:
                matched.add(key)
            for partner in partners or [blank_right]:
                out.append({**row, **{c: partner[c] for c in right_columns}})
        left_columns = [c for c in self._columns if c not in on]
        if how == "outer":
            for row in other.rows:
                key = tuple(row[k] for k in on)
                if None in key or key not in matched:
                    out.append({**{c: None for c in left_columns}, **row})
        return RowFrame(out, list(on) + left_columns + right_columns)

    def union(self, other: Frame) -> "RowFrame":
        """By name, as Spark's ``unionByName``."""
        assert isinstance(other, RowFrame)
        return RowFrame(self.rows + [{c: row[c] for c in self._columns} for row in other.rows],
                        self._columns)

    def fill_zero(self, names: Sequence[str]) -> "RowFrame":
        fill = [n for n in names if n in self._columns]
        return RowFrame([{**row, **{n: 0 for n in fill if row[n] is None}} for row in self.rows],
                        self._columns)

    def order_by(self, *keys: Union[str, Sort]) -> "RowFrame":
        sorts = [k if isinstance(k, Sort) else Sort(k) for k in keys]
        return RowFrame(sorted(self.rows, key=sort_key(sorts)), self._columns)

    def limit(self, n: int) -> "RowFrame":
        return RowFrame(self.rows[:n], self._columns)

    def conform(self, schema: Schema) -> "RowFrame":
        """Python values are already of their column's kind: only the columns and their order."""
        wanted = names(schema)
        return RowFrame([{c: row[c] for c in wanted} for row in self.rows], wanted)

    def collect(self) -> List[Row]:
        return [dict(row) for row in self.rows]


class RowGroups:
    def __init__(self, frame: RowFrame, keys: List[Named]) -> None:
        self.frame, self.keys = frame, keys

    def agg(self, *aggs: NamedAgg) -> RowFrame:
        """One row per distinct key (a single row of the whole frame without keys, as in SQL)."""
        key_fns = [(k.name, k.expr.py()) for k in self.keys]
        groups: Dict[Tuple[Any, ...], List[Row]] = {}
        for row in self.frame.rows:
            groups.setdefault(tuple(fn(row) for _, fn in key_fns), []).append(row)
        if not key_fns and not groups:
            groups[()] = []
        reducers = [(a.name, a.agg.reducer()) for a in aggs]
        rows = [{**dict(zip((name for name, _ in key_fns), key)),
                 **{name: reduce(members) for name, reduce in reducers}}
                for key, members in groups.items()]
        return RowFrame(rows, [name for name, _ in key_fns] + [a.name for a in aggs])
