"""Test generation from parameter lists, and subtest grids inside one test.

`parametrize` marks a test function; `instantiate_parametrized_tests` (or
`instantiate_device_type_tests`, harness/single_process/device_type.py) replaces it with one method
per combination. The generated names are exactly upstream's (PyTorch's common_utils), so a migrated
file keeps its test ids, skip lists and `-k` filters: ints, floats, strs and bools as `name_value`
('.' -> '_'), dtypes by short name, devices as str, anything else as `name<index>`; a `subtest` name
or `name_fn` wins; stacked decorators join their parts top first.

The mark is upstream's protocol: a `parametrize_fn(test, generic_cls, device_cls)`
attribute yielding `(test, name_suffix, param_kwargs, decorator_fn)` per variant, composed
as a product when decorators stack, so every parametrizer (parametrize, dtypes) composes.

Subtest grids inside one test (`run_subtests`) live in harness/single_process/subtests.py.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

PARAMETRIZE_ATTR = "parametrize_fn"  # upstream's attribute name: the parametrizers interoperate
_NAMES_ATTR = "__harness_param_names__"  # parameter names already handled, to catch repeats

DecoratorFn = Callable[[Dict[str, Any]], List[Callable]]
Variant = Tuple[Callable, str, Dict[str, Any], DecoratorFn]
ParametrizeFn = Callable[[Callable, Any, Any], Iterator[Variant]]


def _no_decorators(_params: Dict[str, Any]) -> List[Callable]:
    return []


class subtest:  # noqa: N801 - upstream's name
    """One explicit entry of a `parametrize` list: its values, an optional name, decorators.

    The name replaces the generated one; the decorators apply to this generated test only.
    """

    __slots__ = ("arg_values", "name", "decorators")

    def __init__(
        self, arg_values: Any, name: Optional[str] = None, decorators: Optional[Iterable] = None
    ) -> None:
        self.arg_values = arg_values
        self.name = name
        self.decorators = list(decorators) if decorators else []

    def __repr__(self) -> str:
        return f"subtest({self.arg_values!r}, name={self.name!r})"


def compose_parametrize_fns(old: ParametrizeFn, new: ParametrizeFn) -> ParametrizeFn:
    """The product of two parametrizations; names read `<new>_<old>` (the upper decorator first)."""

    def composite(test: Callable, generic_cls: Any, device_cls: Any) -> Iterator[Variant]:
        old_variants = list(old(test, generic_cls, device_cls))
        for old_test, old_name, old_kwargs, old_decorators in old_variants:
            for new_test, new_name, new_kwargs, new_decorators in new(
                old_test, generic_cls, device_cls
            ):
                repeated = set(old_kwargs) & set(new_kwargs)
                if repeated:
                    raise ValueError(
                        f"{test.__name__}: parameters {sorted(repeated)} are parametrized "
                        "by more than one decorator"
                    )
                joiner = "_" if old_name and new_name else ""

                def decorators(
                    params: Dict[str, Any], first: DecoratorFn = old_decorators,
                    second: DecoratorFn = new_decorators,
                ) -> List[Callable]:
                    return [*first(params), *second(params)]

                merged = {**old_kwargs, **new_kwargs}
                yield new_test, f"{new_name}{joiner}{old_name}", merged, decorators

    return composite


class Parametrizer:
    """Base of test parametrizers: a decorator that adds (or composes) a `parametrize_fn`."""

    def _parametrize_test(
        self, test: Callable, generic_cls: Any, device_cls: Any
    ) -> Iterator[Variant]:
        raise NotImplementedError(f"{type(self).__name__} must define _parametrize_test")

    def __call__(self, fn: Callable) -> Callable:
        previous = getattr(fn, PARAMETRIZE_ATTR, None)
        current = self._parametrize_test
        setattr(fn, PARAMETRIZE_ATTR,
                current if previous is None else compose_parametrize_fns(previous, current))
        return fn


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype's short name as test ids show it: torch.float32 -> float32."""
    return str(dtype).split(".")[1]


def formatted_value(index: int, name: str, value: Any) -> str:
    """Upstream's rendering of one parameter in a test name.

    dtypes by short name, devices as str, ints/floats/strs/bools as `name_value` with '.'
    replaced by '_', anything else (enums, None, objects) by position: `name<index>`.
    """
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.device):
        return str(value)
    if type(value).__name__ in ("OpInfo", "ModuleInfo"):
        return value.formatted_name
    if isinstance(value, (int, float, str)):
        return f"{name}_{str(value).replace('.', '_')}"
    return f"{name}{index}"


class parametrize(Parametrizer):  # noqa: N801 - upstream's name
    """Generate one test per value: `@parametrize("x", [1, 2])`, `@parametrize("x,y", [(1, 2)])`.

    Entries may be `subtest(values, name=..., decorators=[...])`. `name_fn(*values)` names
    the generated tests instead of the default `x_1_y_2`; an explicit subtest name wins
    over both. Stacked decorators give the product of their values.
    """

    def __init__(
        self, arg_str: str, arg_values: Iterable[Any], name_fn: Optional[Callable[..., str]] = None
    ) -> None:
        if not isinstance(arg_str, str):
            raise ValueError(f"parametrize: name must be an identifier, got {arg_str!r}")
        self.arg_names: List[str] = [part.strip() for part in arg_str.split(",") if part != ""]
        if not self.arg_names:
            raise ValueError(f"parametrize: name must be an identifier, got {arg_str!r}")
        for name in self.arg_names:
            if not name.isidentifier():
                raise ValueError(f"parametrize: name must be an identifier, got {name!r}")
        self.label = ",".join(self.arg_names)
        try:
            self.arg_values = list(arg_values)
        except TypeError:
            raise TypeError(
                f"parametrize({self.label!r}): values must be iterable, "
                f"got {type(arg_values).__name__}"
            ) from None
        if not self.arg_values:
            raise ValueError(f"parametrize({self.label!r}): no values given")
        if name_fn is not None and not callable(name_fn):
            raise TypeError(
                f"parametrize({self.label!r}): name_fn must be callable, "
                f"got {type(name_fn).__name__}"
            )
        self.name_fn = name_fn
        self._entries = [self._entry(index, value) for index, value in enumerate(self.arg_values)]

    def _entry(self, index: int, value: Any) -> Tuple[List[Any], Optional[subtest]]:
        """The values of one entry as a list (one per name), and its subtest if it is one."""
        sub = value if isinstance(value, subtest) else None
        values = sub.arg_values if sub is not None else value
        if len(self.arg_names) == 1:
            return [values], sub
        try:
            values = list(values)
        except TypeError:
            values = [values]
        if len(values) != len(self.arg_names):
            raise ValueError(
                f"parametrize({self.label!r}): entry {index} has {len(values)} values "
                f"for {len(self.arg_names)} names"
            )
        return values, sub

    def __call__(self, fn: Callable) -> Callable:
        done = list(getattr(fn, _NAMES_ATTR, []))
        for name in self.arg_names:
            if name in done:
                raise ValueError(
                    f"parametrize({name!r}): {fn.__name__} is already parametrized by it"
                )
            _check_accepts(fn, name)
        fn = super().__call__(fn)
        setattr(fn, _NAMES_ATTR, [*done, *self.arg_names])
        return fn

    def _subtest_name(self, index: int, values: List[Any], explicit: Optional[str]) -> str:
        if explicit:
            return explicit
        if self.name_fn is not None:
            return self.name_fn(*values)
        return "_".join(
            formatted_value(index, name, value) for name, value in zip(self.arg_names, values)
        )

    def _parametrize_test(
        self, test: Callable, generic_cls: Any, device_cls: Any
    ) -> Iterator[Variant]:
        for index, (values, sub) in enumerate(self._entries):
            generated, decorators = test, []
            if sub is not None:
                # Its own function, so the subtest's decorators touch this variant only.
                generated, decorators = _own_copy(test), sub.decorators
            name = self._subtest_name(index, values, sub.name if sub is not None else None)
            yield (
                generated, name, dict(zip(self.arg_names, values)),
                functools.partial(_fixed_decorators, decorators),
            )


def _fixed_decorators(decorators: List[Callable], _params: Dict[str, Any]) -> List[Callable]:
    return list(decorators)


def _own_copy(test: Callable) -> Callable:
    @functools.wraps(test)
    def variant(*args: Any, **kwargs: Any) -> Any:
        return test(*args, **kwargs)

    return variant


def _check_accepts(fn: Callable, name: str) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if name not in params and not takes_kwargs:
        raise ValueError(f"parametrize({name!r}): {fn.__name__} has no parameter {name!r}")


def generated_test(test: Callable, param_kwargs: Dict[str, Any]) -> Callable:
    """The method that runs `test(self, **param_kwargs)`; not itself a parametrization mark."""

    @functools.wraps(test)
    def instantiated_test(self: Any) -> Any:
        return test(self, **param_kwargs)

    # wraps copied the marks: the generated method must not be parametrized again.
    for attr in (PARAMETRIZE_ATTR, _NAMES_ATTR, "dtypes"):
        instantiated_test.__dict__.pop(attr, None)
    return instantiated_test


def add_generated_test(cls: type, name: str, method: Callable) -> None:
    """Set `cls.<name>`; two variants with one name are an error, as upstream."""
    if hasattr(cls, name):
        raise ValueError(
            f"Redefinition of test {name} in {cls.__name__}: two parametrizations give "
            "the same name (give them distinct subtest names or a name_fn)"
        )
    setattr(cls, name, method)


def instantiate_parametrized_tests(generic_cls: type) -> type:
    """Replace every parametrized method of `generic_cls` with one method per variant.

    Usable as a class decorator. A variant is named `<test>_<suffix>`; its decorators (from
    `subtest(..., decorators=...)`) apply to it alone.
    """
    for attr in tuple(dir(generic_cls)):
        template = getattr(generic_cls, attr)
        parametrize_fn = getattr(template, PARAMETRIZE_ATTR, None)
        if parametrize_fn is None or not callable(template):
            continue
        if attr in vars(generic_cls):
            delattr(generic_cls, attr)
        else:  # inherited from an uninstantiated base: hide it from the loader here
            setattr(generic_cls, attr, None)
        for test, suffix, param_kwargs, decorator_fn in parametrize_fn(
            template, generic_cls, None
        ):
            name = f"{test.__name__}_{suffix}"  # named before the variant's decorators wrap it
            for decorator in decorator_fn(param_kwargs):
                test = decorator(test)
            add_generated_test(generic_cls, name, generated_test(test, param_kwargs))
    return generic_cls
