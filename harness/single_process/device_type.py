"""Device-type test generation: `instantiate_device_type_tests` and its decorators.

A generic test class becomes one class per device type, `<Class>CPU` (and `<Class>CUDA`
where GPUs are used), defined in the caller's module, with methods named as upstream's
(upstream's common_device_type): `test_x_cpu`, `test_x_<params>_cpu`,
`test_x_cpu_float32`; each receives `device` (and `dtype` under `@dtypes`) when it takes it.

The device class puts `DeviceTypeTestBase` (a harness `TestCase`) before the generic class,
so the generic class's `setUp` still runs through the harness's chain and multi-rank bases
start their ranks; rank processes rebuild the test from the class's module and name. Device
restrictions (`onlyCUDA`, `skipCPUIf(True, ...)`, `deviceCountAtLeast`, ...) are decided when
the tests are generated, as unittest skips, so a skipped multi-rank test starts no rank.
"""

from __future__ import annotations

import functools
import inspect
import unittest
from collections.abc import MutableMapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from harness import settings
from harness.requirements import decorators
from harness.single_process.parametrize import (
    PARAMETRIZE_ATTR,
    Variant,
    add_generated_test,
    compose_parametrize_fns,
    dtype_name,
    generated_test,
)
from harness.single_process.testcase import TestCase

DeviceTypes = Union[str, Sequence[str], None]

# Checks run against the device class when its tests are generated: each returns a skip reason.
DEVICE_CHECKS_ATTR = "__harness_device_checks__"
NATIVE_DEVICE_TYPES = ("cpu", "cuda", "xpu", "meta", "mps", "mtia")
NON_ACCELERATOR_TYPES = ("cpu", "meta")
ONLY_FOR_ENV = "PYTORCH_TESTING_DEVICE_ONLY_FOR"
EXCEPT_FOR_ENV = "PYTORCH_TESTING_DEVICE_EXCEPT_FOR"


class DeviceTypeTestBase(TestCase):
    """Base of the generated per-device classes: `device_type` and how tests are generated."""

    device_type: str = "generic_device_type"

    @classmethod
    def get_primary_device(cls) -> str:
        """The device string single-device tests receive as `device`."""
        return cls.device_type

    @classmethod
    def get_all_devices(cls) -> List[str]:
        """Every device of this type, primary first (what `deviceCountAtLeast` tests receive)."""
        return [cls.get_primary_device()]

    @classmethod
    def _get_dtypes(cls, test: Callable) -> Optional[Sequence[Any]]:
        declared = getattr(test, "dtypes", None)
        if declared is None:
            return None
        if "all" not in declared:
            raise ValueError(
                f"@dtypes is mandatory when using @dtypesIf however {test.__name__!r} "
                "didn't specify it"
            )
        return declared.get(cls.device_type, declared["all"])

    @classmethod
    def instantiate_test(cls, name: str, test: Callable, *, generic_cls: Any = None) -> None:
        """Add this device type's variants of the generic test `name` to the class."""
        parametrize_fn = getattr(test, PARAMETRIZE_ATTR, _single_variant)
        dtypes_list = cls._get_dtypes(test)
        if dtypes_list is not None:
            parametrize_fn = compose_parametrize_fns(
                functools.partial(_dtype_variants, dtypes_list), parametrize_fn
            )
        for variant, suffix, param_kwargs, decorator_fn in parametrize_fn(test, generic_cls, cls):
            param_kwargs = dict(param_kwargs)
            parameters = inspect.signature(variant).parameters
            if "device" in parameters or "devices" in parameters:
                wanted = (
                    cls.get_all_devices() if hasattr(variant, "num_required_devices")
                    else cls.get_primary_device()
                )
                _update_param_kwargs(param_kwargs, "device", wanted)
            for decorator in decorator_fn(param_kwargs):
                variant = decorator(variant)
            method = generated_test(variant, param_kwargs)
            reason = _static_skip_reason(method, cls)
            if reason is not None:
                method = unittest.skip(reason)(method)
            dtype_value = param_kwargs.get("dtypes", param_kwargs.get("dtype"))
            test_suffix = f"_{suffix}" if suffix else ""
            device_suffix = f"_{_device_type_name(cls)}"
            add_generated_test(
                cls, f"{name}{test_suffix}{device_suffix}{_dtype_suffix(dtype_value)}", method
            )


class CPUTestBase(DeviceTypeTestBase):
    """The CPU variant: tests receive device "cpu"."""

    device_type = "cpu"


class CUDATestBase(DeviceTypeTestBase):
    """The CUDA variant: tests receive the current device, "cuda:0" unless CUDA moved it."""

    device_type = "cuda"

    @classmethod
    def get_primary_device(cls) -> str:
        # Without initialising CUDA: the test module is imported in the forkserver too, whose
        # forked ranks could not use CUDA any more.
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        return f"cuda:{index}"

    @classmethod
    def get_all_devices(cls) -> List[str]:
        primary = cls.get_primary_device()
        others = [f"cuda:{i}" for i in range(settings.accelerator_count())]
        return [primary, *(d for d in others if d != primary)]


DEVICE_TYPE_BASES: Dict[str, type] = {"cpu": CPUTestBase, "cuda": CUDATestBase}


def _single_variant(test: Callable, generic_cls: Any, device_cls: Any) -> Iterator[Variant]:
    yield test, "", {}, lambda _params: []


def _dtype_variants(
    dtypes_list: Sequence[Any], test: Callable, generic_cls: Any, device_cls: Any
) -> Iterator[Variant]:
    for dtype in dtypes_list:
        param_kwargs: Dict[str, Any] = {}
        _update_param_kwargs(param_kwargs, "dtype", dtype)
        yield test, "", param_kwargs, lambda _params: []  # the dtype is named after the device


def _update_param_kwargs(param_kwargs: Dict[str, Any], name: str, value: Any) -> None:
    """Set `name` (or its plural for a list or tuple) as upstream passes it."""
    param_kwargs.pop(name, None)
    param_kwargs.pop(f"{name}s", None)
    if isinstance(value, (list, tuple)):
        param_kwargs[f"{name}s"] = value
    elif value is not None:
        param_kwargs[name] = value


def _dtype_suffix(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "".join(f"_{dtype_name(d)}" for d in value)
    if isinstance(value, torch.dtype):
        return f"_{dtype_name(value)}"
    return ""


def _static_skip_reason(method: Callable, device_cls: type) -> Optional[str]:
    for check in getattr(method, DEVICE_CHECKS_ATTR, []):
        reason = check(device_cls)
        if reason is not None:
            return reason
    return None


def _with_device_check(wrapper: Callable, check: Callable[[type], Optional[str]]) -> Callable:
    """Record `check` on the wrapper (after functools.wraps copied the inner function's)."""
    setattr(wrapper, DEVICE_CHECKS_ATTR, [*getattr(wrapper, DEVICE_CHECKS_ATTR, []), check])
    return wrapper


def _device_type_name(device_cls: type) -> str:
    """The device type that names the tests, from the device base even if a member shadows it."""
    for klass in device_cls.__mro__:
        value = vars(klass).get("device_type")
        if isinstance(value, str):
            return value
    raise TypeError(f"{device_cls.__name__} has no device_type string")


def _class_device_type(device_cls: type) -> Optional[str]:
    """The class's device type when it is a plain string (a property decides only at run time)."""
    value = getattr(device_cls, "device_type", None)
    return value if isinstance(value, str) else None


def _device_type_names(value: DeviceTypes, what: str) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # upstream tests membership in the string: "cpu,cuda" names two
        return tuple(value.split(","))
    if isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"{what} must be a device type string or a sequence of them, got {value!r}")


def _env_device_types(name: str) -> Tuple[str, ...]:
    return settings.env_list(name)


def _selected(device_type: str, only_for: Tuple[str, ...], except_for: Tuple[str, ...]) -> bool:
    return device_type not in except_for and (not only_for or device_type in only_for)


def _with_cpu_for_accelerators(only: Tuple[str, ...]) -> Tuple[str, ...]:
    """`only` plus "cpu" when it names an accelerator type (the CPU stands in for it)."""
    if any(t not in NON_ACCELERATOR_TYPES for t in only) and "cpu" not in only:
        return (*only, "cpu")
    return only


def _runs_as_accelerator(device_type: str) -> bool:
    """Whether a test restricted to accelerators runs in `device_type`'s class: an accelerator
    type does, and "cpu" does while the CPU stands in for accelerators (HARNESS_ALLOW_CPU=1)."""
    if device_type == "cpu":
        return decorators.cpu_stands_in()
    return device_type not in NON_ACCELERATOR_TYPES


def device_types_to_instantiate(
    except_for: DeviceTypes = None,
    only_for: DeviceTypes = None,
    include_lazy: bool = False,
    allow_mps: bool = False,
    allow_xpu: bool = False,
) -> List[str]:
    """Which device types get a class: the one place that decides it.

    Available: "cpu", plus "cuda" when GPUs are used (not forced off by HARNESS_DEVICE=cpu).
    `only_for` / `except_for` (and upstream's PYTORCH_TESTING_DEVICE_ONLY_FOR / _EXCEPT_FOR
    env lists) filter them. The harness runs no lazy, MPS or XPU backend, so those flags
    add no class. With HARNESS_ALLOW_CPU=1 on a machine without accelerators, an `only_for`
    naming an accelerator type ("cuda", ("cuda", "hpu"), "xpu") also selects "cpu", unless
    "cpu" is excluded.
    """
    only = _device_type_names(only_for, "only_for")
    excluded = _device_type_names(except_for, "except_for")
    both = sorted(set(only) & set(excluded))
    if both:
        raise ValueError(f"device types {both} appear in both only_for and except_for")
    available = ["cpu", *(["cuda"] if settings.accelerator_count() > 0 else [])]
    env_only, env_excluded = _env_device_types(ONLY_FOR_ENV), _env_device_types(EXCEPT_FOR_ENV)
    if decorators.cpu_stands_in():
        only, env_only = _with_cpu_for_accelerators(only), _with_cpu_for_accelerators(env_only)
    return [
        t for t in available
        if _selected(t, only, excluded) and _selected(t, env_only, env_excluded)
    ]


def instantiate_device_type_tests(
    generic_test_class: type,
    scope: MutableMapping[str, Any],
    except_for: DeviceTypes = None,
    only_for: DeviceTypes = None,
    include_lazy: bool = False,
    allow_mps: bool = False,
    allow_xpu: bool = False,
) -> None:
    """Replace `generic_test_class` in `scope` (the module's globals()) by its device classes.

    Each `<Class><DEVICE>` derives from the device base and the generic class, has the
    generic class's module, and holds the generated tests; the generic class leaves the
    scope and loses its test methods, so only the device classes are discovered.
    """
    if not isinstance(generic_test_class, type):
        raise TypeError(
            f"instantiate_device_type_tests: expected a test class, got {generic_test_class!r}"
        )
    if not isinstance(scope, MutableMapping):
        raise TypeError(
            f"instantiate_device_type_tests: scope must be a dict such as globals(), "
            f"got {type(scope).__name__}"
        )
    class_name = generic_test_class.__name__
    if scope.get(class_name) is not generic_test_class:
        raise ValueError(
            f"instantiate_device_type_tests: {class_name} is not in the scope given; pass "
            "globals() of the module that defines it"
        )
    device_types = device_types_to_instantiate(
        except_for, only_for, include_lazy, allow_mps, allow_xpu
    )
    del scope[class_name]
    members = dict(vars(generic_test_class))
    tests = [n for n, v in members.items() if n.startswith("test") and callable(v)]
    for device_type in device_types:
        base = DEVICE_TYPE_BASES[device_type]
        device_class_name = class_name + device_type.upper()
        device_class: Any = type(device_class_name, (base, generic_test_class), {})
        for name, member in members.items():
            if name in tests:
                device_class.instantiate_test(name, member, generic_cls=generic_test_class)
            elif name not in vars(device_class):
                # As upstream: the generic class's own members win over the device base's.
                setattr(device_class, name, member)
        device_class.__module__ = generic_test_class.__module__
        scope[device_class_name] = device_class
    for name in tests:
        delattr(generic_test_class, name)


class dtypes:  # noqa: N801 - upstream's name
    """Generate one test per dtype (or per tuple of dtypes), named `test_x_<device>_<dtype>`.

    `device_type` restricts these dtypes to one device type; "all" is the default list.
    """

    def __init__(self, *args: Any, device_type: str = "all") -> None:
        if args and isinstance(args[0], (list, tuple)):
            for arg in args:
                if not isinstance(arg, (list, tuple)) or not all(
                    isinstance(d, torch.dtype) for d in arg
                ):
                    raise TypeError(
                        f"dtypes: when one variant is a list or tuple, all must be lists or "
                        f"tuples of torch.dtype, got {arg!r}"
                    )
        elif not all(isinstance(d, torch.dtype) for d in args):
            raise TypeError(f"dtypes: expected torch.dtype values, got {args!r}")
        self.args = args
        self.device_type = device_type

    def __call__(self, fn: Callable) -> Callable:
        declared = dict(getattr(fn, "dtypes", {}))
        if self.device_type in declared:
            raise ValueError(f"dtypes: {fn.__name__} already has dtypes for {self.device_type!r}")
        declared[self.device_type] = self.args
        fn.dtypes = declared  # type: ignore[attr-defined]
        return fn


class dtypesIfCPU(dtypes):  # noqa: N801 - upstream's name
    """The dtypes for the CPU variant, replacing @dtypes's there."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args, device_type="cpu")


class dtypesIfCUDA(dtypes):  # noqa: N801 - upstream's name
    """The dtypes for the CUDA variant, replacing @dtypes's there."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args, device_type="cuda")


def _skip_unless_device(
    fn: Callable, allowed: Callable[[str], bool], reason: Callable[[str], str]
) -> Callable:
    """Run `fn` only on device types `allowed` accepts; decided at generation when possible."""

    @functools.wraps(fn)
    def only_fn(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not allowed(self.device_type):
            raise unittest.SkipTest(reason(self.device_type))
        return fn(self, *args, **kwargs)

    def check(device_cls: type) -> Optional[str]:
        device_type = _class_device_type(device_cls)
        return None if device_type is None or allowed(device_type) else reason(device_type)

    return _with_device_check(only_fn, check)


class onlyOn:  # noqa: N801 - upstream's name
    """Run the test only on the given device type(s); elsewhere it is skipped."""

    def __init__(self, device_type: Union[str, Sequence[str]]) -> None:
        self.device_type = device_type

    def __call__(self, fn: Callable) -> Callable:
        return _skip_unless_device(
            fn, lambda t: t in self.device_type, lambda _t: f"Only runs on {self.device_type}"
        )


def onlyCPU(fn: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Run the test only in the CPU class."""
    return onlyOn("cpu")(fn)


def onlyCUDA(fn: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Run the test only in the CUDA class (skipped on CPU: it needs a GPU), and in the CPU
    class while the CPU stands in for accelerators (HARNESS_ALLOW_CPU=1, none present)."""
    return _skip_unless_device(
        fn, lambda t: t == "cuda" or (t == "cpu" and _runs_as_accelerator(t)),
        lambda _t: "Only runs on cuda",
    )


def onlyAccelerator(fn: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Run the test only on an accelerator (skipped in the CPU class unless the CPU stands in
    for accelerators: HARNESS_ALLOW_CPU=1 with none present)."""
    return _skip_unless_device(
        fn, _runs_as_accelerator,
        lambda _t: "onlyAccelerator: doesn't run on CPU or meta devices",
    )


def onlyNativeDeviceTypes(fn: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Run the test only on PyTorch's native device types (CPU and CUDA here)."""
    return _skip_unless_device(
        fn, lambda t: t in NATIVE_DEVICE_TYPES,
        lambda t: f"onlyNativeDeviceTypes: doesn't run on {t}",
    )


class skipIf:  # noqa: N801 - upstream's name
    """Skip on `device_type` (all when None) if `dep` is True, or names a true attribute."""

    def __init__(self, dep: Union[bool, str], reason: str, device_type: DeviceTypes = None) -> None:
        if not isinstance(dep, (bool, str)):
            raise TypeError(f"skipIf: dep must be a bool or an attribute name, got {dep!r}")
        self.dep = dep
        self.reason = reason
        self.device_type = device_type

    def _applies_to(self, device_type: str) -> bool:
        wanted = self.device_type
        return wanted is None or device_type == wanted or (
            not isinstance(wanted, str) and device_type in wanted
        )

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def dep_fn(slf: Any, *args: Any, **kwargs: Any) -> Any:
            if self._applies_to(slf.device_type):
                if (isinstance(self.dep, str) and getattr(slf, self.dep, True)) or self.dep is True:
                    raise unittest.SkipTest(self.reason)
            return fn(slf, *args, **kwargs)

        def check(device_cls: type) -> Optional[str]:
            device_type = _class_device_type(device_cls)
            if self.dep is True and device_type is not None and self._applies_to(device_type):
                return self.reason
            return None  # an attribute dep is read from the test instance when it runs

        return _with_device_check(dep_fn, check)


class skipCPUIf(skipIf):  # noqa: N801 - upstream's name
    """Skip in the CPU class if `dep` holds."""

    def __init__(self, dep: Union[bool, str], reason: str) -> None:
        super().__init__(dep, reason, device_type="cpu")


class skipCUDAIf(skipIf):  # noqa: N801 - upstream's name
    """Skip in the CUDA class if `dep` holds."""

    def __init__(self, dep: Union[bool, str], reason: str) -> None:
        super().__init__(dep, reason, device_type="cuda")


class skipXPUIf(skipIf):  # noqa: N801 - upstream's name
    """Skip in the XPU class if `dep` holds."""

    def __init__(self, dep: Union[bool, str], reason: str) -> None:
        super().__init__(dep, reason, device_type="xpu")


class skipMetaIf(skipIf):  # noqa: N801 - upstream's name
    """Skip in the meta class if `dep` holds."""

    def __init__(self, dep: Union[bool, str], reason: str) -> None:
        super().__init__(dep, reason, device_type="meta")


def skipMeta(fn: Callable) -> Callable:  # noqa: N802 - upstream's name
    """Skip in the meta class: the test needs real data."""
    return skipMetaIf(True, "test doesn't work with meta tensors")(fn)


class deviceCountAtLeast:  # noqa: N801 - upstream's name
    """The test receives `devices` (every device of its type) and needs at least n of them."""

    def __init__(self, num_required_devices: int) -> None:
        if isinstance(num_required_devices, bool) or not isinstance(num_required_devices, int):
            raise TypeError(
                f"deviceCountAtLeast: expected an int, got {num_required_devices!r}"
            )
        self.num_required_devices = num_required_devices

    def _reason(self) -> str:
        return f"fewer than {self.num_required_devices} devices detected"

    def __call__(self, fn: Callable) -> Callable:
        if hasattr(fn, "num_required_devices"):
            raise ValueError(f"deviceCountAtLeast: {fn.__name__} already has one")
        fn.num_required_devices = self.num_required_devices  # type: ignore[attr-defined]

        @functools.wraps(fn)
        def multi_fn(slf: Any, devices: List[str], *args: Any, **kwargs: Any) -> Any:
            if len(devices) < self.num_required_devices:
                raise unittest.SkipTest(self._reason())
            return fn(slf, devices, *args, **kwargs)

        def check(device_cls: type) -> Optional[str]:
            getter = getattr(device_cls, "get_all_devices", None)
            if getter is None or len(getter()) >= self.num_required_devices:
                return None
            return self._reason()

        return _with_device_check(multi_fn, check)
