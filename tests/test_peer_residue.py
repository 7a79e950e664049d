"""What the peers' own test suites do that flopscope did not (issue 23, item 8): an input that requires grad, is not
a leaf and is changed in place by the forward (PyTorch's ``test_pytrees``), and a shared module found by every name
it has (fvcore's ``canonical_module_name``). Expected numbers are closed forms."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flopscope
from flopscope.capture.facts import read_facts

N = 10


class _ReluMm(nn.Module):
    """``x = x["a"].relu_(); {"a": x @ x}``: PyTorch's test_pytrees block (an in-place op on its input)."""

    def forward(self, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        y = x["a"].relu_()
        return {"a": torch.mm(y, y)}


class _Pytrees(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _ReluMm(), _ReluMm()

    def forward(self, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.b(self.a(x))


def _non_leaf() -> torch.Tensor:
    x = torch.randn(N, N, requires_grad=True).clone()  # requires grad, made outside the model: not a leaf
    assert x.requires_grad and not x.is_leaf
    return x


@pytest.mark.parametrize("mode", ["real", "fake", "auto"])
def test_a_non_leaf_input_changed_in_place_counts_in_every_mode(mode: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "auto" must not fall back to a real run (it did: fake mode raised)
        prof = flopscope.profile(_Pytrees(), {"a": _non_leaf()}, mode=mode)
    assert prof.mode == ("real" if mode == "real" else "fake")
    assert prof.total() == 2 * N * N * N  # two [N, N] @ [N, N]
    assert prof.total("a") == prof.total("b") == N * N * N


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_a_non_leaf_input_changed_in_place_counts_its_backward(mode: str) -> None:
    prof = flopscope.profile(_Pytrees(), {"a": _non_leaf()}, mode=mode, backward=True)
    # forward: two mm; backward: each mm(y, y) gives two gradient products (y is both operands)
    assert prof.by_phase() == {"forward": 2 * N * N * N, "backward": 2 * 2 * N * N * N}


class _InPlaceLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)  # the input, in place
        return self.lin(x)


def test_a_non_leaf_input_changed_in_place_counts_on_meta_kernels() -> None:
    with torch.device("meta"):
        model = _InPlaceLinear()
    x = torch.randn(3, 8, requires_grad=True).clone()
    prof = flopscope.profile(model, x, mode="fake")
    assert prof.total() == 3 * 8 * 16


def test_a_caller_fake_non_leaf_input_changed_in_place_counts() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        model = _InPlaceLinear()
        x = torch.randn(3, 8, requires_grad=True).clone()
    assert not x.is_leaf and x.fake_mode is mode
    prof = flopscope.profile(model, x, mode="fake")
    assert prof.total() == 3 * 8 * 16
    assert x.grad_fn is not None and x._version == 0  # the caller's tensor: not written


def test_the_users_non_leaf_input_is_left_as_it_was_by_a_fake_run() -> None:
    x = _non_leaf()
    before = x.detach().clone()
    flopscope.profile(_Pytrees(), {"a": x}, mode="fake")
    assert x._version == 0 and torch.equal(x.detach(), before)


# -------------------------------------------------------------------------------------------------
# a module registered under several names
D_IN, D_OUT, ROWS = 4, 8, 3


class _Sub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D_IN, D_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class _Shared(nn.Module):
    """One ``_Sub`` registered as ``submod1.submod`` and ``submod2.submod``; called once through each name."""

    def __init__(self) -> None:
        super().__init__()
        shared = _Sub()
        self.submod1, self.submod2 = nn.Module(), nn.Module()
        self.submod1.submod = shared
        self.submod2.submod = shared
        self.other = nn.Linear(D_OUT, D_IN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.submod2.submod(self.other(self.submod1.submod(x)))


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_a_shared_module_is_found_by_every_name_it_has(mode: str) -> None:
    model = _Shared()
    names = [name for name, _ in model.named_modules(remove_duplicate=False)]
    assert "submod2.submod" in names and "submod2.submod.lin" in names
    prof = flopscope.profile(model, torch.randn(ROWS, D_IN), mode=mode)
    calls = 2 * ROWS * D_IN * D_OUT  # the shared Linear, called twice
    assert prof.total() == calls + ROWS * D_OUT * D_IN
    for first, other in (("submod1.submod", "submod2.submod"), ("submod1.submod.lin", "submod2.submod.lin")):
        assert prof.total(first) == prof.total(other) == calls
        assert prof.canonical_module_name(other) == first
        assert prof.total_bytes(other) == prof.total_bytes(first) > 0
        assert prof.total_flops(other) == 2 * calls
    assert prof.canonical_module_name("submod2") == "submod2"  # a name of its own
    assert prof.total("submod2") == 0  # the container never ran: its child ran through its own path
    with pytest.raises(flopscope.NotFoundError, match="submod3"):
        prof.total("submod3.submod")


def test_aliases_are_named_modules_own_names_in_its_order() -> None:
    model = _Shared()
    facts = read_facts(model)
    every = [name for name, _ in model.named_modules(remove_duplicate=False)]
    first = [name for name, _ in model.named_modules()]
    assert list(facts.types) == first
    assert set(facts.aliases) == set(every) - set(first) == {"submod2.submod", "submod2.submod.lin"}
    modules = dict(model.named_modules(remove_duplicate=False))
    assert all(modules[alias] is modules[path] for alias, path in facts.aliases.items())


def test_a_module_registered_first_deep_and_then_shallow_keeps_its_first_name() -> None:
    # named_modules() is depth first: a.s comes before s2, which is the same module
    root = nn.Module()
    root.a = nn.Module()
    root.a.s = nn.Linear(2, 3)
    root.s2 = root.a.s
    assert read_facts(root).aliases == {"s2": "a.s"}


def test_a_module_holding_its_parent_is_named_there_once() -> None:
    root = nn.Sequential(nn.Linear(2, 3))
    root[0].back = root  # registered inside its own child: named_modules(remove_duplicate=False) recurses forever
    assert read_facts(root).aliases == {"0.back": ""}


def test_a_model_without_shared_modules_has_no_aliases() -> None:
    assert read_facts(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))).aliases == {}
