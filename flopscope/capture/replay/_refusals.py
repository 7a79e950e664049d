"""Every reason a call is not replayed, in one table: :data:`REFUSALS`, :data:`MISSES`.

A refusal says why a key gets no template: its calls are captured every time. Each is a
named :class:`Refusal`: the function that decides it, and the words a profile prints for
it (``Profile.reuse``, a pipeline's notes), word for word. A check raises
``NAME.refused(fields)``; the replayer keeps the words as the key's reason.

A miss says why a block call found no earlier block's template, though no refusal
stopped it: its key or the attributes it reads differ from the first block's. It is
printed once per list of blocks.

The order is the order of a call's life: wrapping, keying, the first call watched (its
given objects, its attributes, the lists and dicts it changed, its outputs), the
template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Refused(Exception):  # noqa: N818  (a reason, not an error: caught in the package)
    """Why a call's records cannot be reused: a :class:`Refusal`'s words, said."""


@dataclass(frozen=True)
class Refusal:
    """One reason a call is not replayed.

    ``where``: the function that decides it. ``words``: the note, with ``{fields}`` that
    :meth:`say` fills in.
    """

    where: str
    words: str

    def say(self, **fields: Any) -> str:
        """The words, with ``fields`` filled in."""
        return self.words.format(**fields) if fields else self.words

    def refused(self, **fields: Any) -> Refused:
        """The exception a check raises, carrying the words said."""
        return Refused(self.say(**fields))


# Wrapping a module (CallReplayer.wrapping).
REPLACED_FORWARD = Refusal(
    "CallReplayer.wrapping",
    "its forward is replaced on the instance (a hook: offloading, caching), state a key cannot see")

# Keying a call (key.call_key, key.state_of; a block: key.owns_its_paths).
SHARED_MODULE = Refusal(
    "key.owns_its_paths",
    "a module inside a block is shared with another place (its calls are attributed to its first "
    "path)")
REAL_RUN = Refusal("key.call_key", "a real run computes every call")
GRAD_MODE = Refusal("key.call_key", "grad mode is on (an autograd graph is built)")
AUTOCAST = Refusal("key.call_key", "autocast is on")
SYMBOLIC_SIZE = Refusal("key.call_key", "an argument has a symbolic size")
STAND_IN_ARGUMENT = Refusal(
    "key.call_key",
    "an argument is a module's attribute as read while a block around it was watched")
USERS_OBJECT = Refusal(
    "key.call_key",
    "it is given a {kind} its model holds (the user's object: only objects the run made or copied "
    "are watched)")
OTHER_ARGUMENT = Refusal("key.call_key",
                         "an argument is a {kind} (only tensors and plain values are keyed)")
HOOKS_INSIDE = Refusal("key.state_of",
                       "{kind} inside it has hooks of its own (state a key cannot see)")

# The objects a first call is given (given_objects: each a problem of its ObjectLog).
UNWATCHABLE_OBJECT = Refusal("given_objects.watching", "a {kind} it was given cannot be watched")
OBJECT_READ = Refusal(
    "given_objects._calling_methods",
    "it read {name!r} of the {kind} it was given (state a key cannot see)")
OBJECT_SET = Refusal(
    "given_objects._calling_methods",
    "it set {name!r} of the {kind} it was given (a replay would not)")
OUTSIDE_ATTRIBUTE = Refusal("given_objects._calling",
                            "it gave {method} an attribute of a module outside it")
OTHER_CALLOUT_ARGUMENT = Refusal(
    "given_objects._calling",
    "it gave {method} a {kind} (only tensors, attributes and plain values are given again)")
CALLOUT_TENSOR_NOT_MADE = Refusal("given_objects._calling",
                                  "{method} returned a tensor it did not make")
OTHER_CALLOUT_OUTPUT = Refusal("given_objects._calling", "{method} returned a {kind}")

# The first call's own attributes (template.first_call).
CHANGED_ATTRIBUTES = Refusal(
    "template.first_call",
    "it changed attributes of its modules ({names}): state a replay would not change")

# The lists and dicts the first call was given (containers.changes).
DICT_KEYS = Refusal("containers.changes",
                    "it changed a dict it was given whose keys are not plain values")
FOREIGN_TENSOR_LEFT = Refusal(
    "containers.changes",
    "it put a tensor it did not allocate (a parameter, a view of an input) in a list or dict it "
    "was given")
NEW_OBJECT_LEFT = Refusal(
    "containers.changes",
    "it put a new {kind} in a list or dict it was given (only tensors and plain values are remade)")

# The first call's outputs (template._outputs).
STAND_IN_OUTPUT = Refusal(
    "template._outputs",
    "it returns a module's attribute as read (a replay would return the first block's)")
FOREIGN_OUTPUT = Refusal(
    "template._outputs",
    "it returns a tensor it did not allocate (a parameter, a view of an input or a parameter)")
KNOWN_OUTPUT = Refusal("template._outputs",
                       "an output's values are known (a later read of them would differ)")
OUTPUT_REQUIRES_GRAD = Refusal("template._outputs", "an output requires grad")
OTHER_OUTPUT = Refusal("template._outputs",
                       "it returns a {kind} (only tensors and plain values are remade)")
MIXED_GRAD_VIEWS = Refusal(
    "template._outputs",
    "outputs viewing one storage differ in requires_grad (a replay views one base)")

# The first call's records, made a template (template._template).
VALUE_READS = Refusal(
    "template._template",
    "it read the values of tensors {count} time(s) (what runs may depend on them)")
OUTSIDE_WRITES = Refusal(
    "template._template",
    "it wrote {count} time(s) to storage it did not allocate (an input, a parameter, a cache)")
LATE_PARAMETERS = Refusal("template._template", "parameters appeared during the call")
RECORD_OUTSIDE = Refusal("template._template", "a record ({op}) is outside the call's module calls")
CALLS_ITSELF = Refusal("template._template", "it calls itself")

REFUSALS: tuple[Refusal, ...] = (
    REPLACED_FORWARD,
    SHARED_MODULE, REAL_RUN, GRAD_MODE, AUTOCAST, SYMBOLIC_SIZE, STAND_IN_ARGUMENT, USERS_OBJECT,
    OTHER_ARGUMENT,
    HOOKS_INSIDE,
    UNWATCHABLE_OBJECT, OBJECT_READ, OBJECT_SET, OUTSIDE_ATTRIBUTE, OTHER_CALLOUT_ARGUMENT,
    CALLOUT_TENSOR_NOT_MADE,
    OTHER_CALLOUT_OUTPUT,
    CHANGED_ATTRIBUTES,
    DICT_KEYS, FOREIGN_TENSOR_LEFT, NEW_OBJECT_LEFT,
    STAND_IN_OUTPUT, FOREIGN_OUTPUT, KNOWN_OUTPUT, OUTPUT_REQUIRES_GRAD, OTHER_OUTPUT,
    MIXED_GRAD_VIEWS,
    VALUE_READS, OUTSIDE_WRITES, LATE_PARAMETERS, RECORD_OUTSIDE, CALLS_ITSELF,
)
"""Every refusal, in the order of a call's life."""

# A block's key against its list's first block's (key.key_difference).
OTHER_CLASSES = Refusal("key.key_difference", "its blocks are of different classes")
OTHER_STRUCTURE = Refusal(
    "key.key_difference", "a block was given arguments of another structure than the first block")
OTHER_ARGUMENTS = Refusal(
    "key.key_difference",
    "a block was given other arguments than the first block (argument {at}: {now}, the first "
    "block's {was})")
OTHER_SUBMODULE_COUNT = Refusal("key.key_difference", "its blocks hold different submodules")
OTHER_SUBMODULES = Refusal("key.key_difference",
                           "its blocks hold different submodules ({where}: {was}, {now})")
OTHER_MODES = Refusal("key.key_difference",
                      "its blocks are in different modes ({where}: training or eval)")
OTHER_TENSORS = Refusal(
    "key.key_difference",
    "its blocks' parameters or buffers differ in shape, dtype or requires_grad ({where})")
OTHER_ATTRIBUTES = Refusal("key.key_difference",
                           "its blocks differ in plain attributes ({where}: {names})")
OTHER_KEYS = Refusal("key.key_difference", "its blocks' keys differ")

# The same key, but not the same template (CallReplayer._missed).
OTHER_READS = Refusal(
    "CallReplayer._missed",
    "its blocks differ in the plain attributes their calls read ({names}{more}; an object is held "
    "alike only where it is a plain value, holds plain values or is a module holding no tensors)")
OTHER_SIZES = Refusal(
    "CallReplayer._missed",
    "the objects it is given (a cache) gave other sizes than at an earlier block's call (a "
    "decoding step's grown cache)")

MISSES: tuple[Refusal, ...] = (
    OTHER_CLASSES, OTHER_STRUCTURE, OTHER_ARGUMENTS, OTHER_SUBMODULE_COUNT, OTHER_SUBMODULES,
    OTHER_MODES,
    OTHER_TENSORS, OTHER_ATTRIBUTES, OTHER_KEYS, OTHER_READS, OTHER_SIZES,
)
"""Every reason a block call found no earlier block's template, though nothing refused
it."""
