"""The vocabulary of the spool's field tables: a ``Field`` (one key), a ``Table`` (one object),
the kinds a key can have and the revisions keys appeared in. ``oomsight.wire.fields`` holds the
tables themselves."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Optional

BASE = "1"
"""The revision of the shipped H200 tape (``oomsight/tools/data/h200-demo.tape.jsonl.gz``)."""
LATER = "1.1"
"""Keys and kinds written before this table existed but after the tape was recorded."""
STEP_MEMORY = "1.2"
"""Step-resolved memory, the job's setup and the OOM's phase and model states."""
PREDICTED = "1.3"
"""The job's predicted peak (``oomsight predict``), to be judged against the measured one."""
AT_OOM = "1.4"
"""What the failing thread and the last seconds show at an OOM: whether autograd was recording,
the sampler's last readings and the last optimizer step's time (inference and evaluation told
from training, memory that piles up across forwards without a step)."""
JUDGED = "1.5"
"""The hook judges its own step rows at each publish and writes the verdict (``step_trend``); the
snapshot then carries only its last step row, so a scrape parses 3 KB a process instead of 20 KB.
An OOM event also tells whether the failing forward's model was in training mode."""

LAYOUT = "1.6"
"""How the job lays out its memory: the parallelism in use (DDP, FSDP, FSDP2, ZeRO, world size),
frozen and quantised parameters and adapters counted by their local storage, CUDA-graph pools,
activation offload told apart from checkpointing, how an OOM was captured, and the memory outside
the allocator at each step row."""

FORWARDS = "1.7"
"""Memory after each forward of the outermost model that recorded an autograd graph, with no optimizer
step since (evaluation, inference, a training job's pause), and the hook's verdict on it: a loop that
keeps every batch's graph is seen at any speed, where the sampler's readings are too slow."""

CONSUMED = "1.8"
"""What a training job's own backwards consume of its forwards' graphs, at an OOM: the forwards that
recorded a graph since a backward last consumed one, and the most one backward consumed together. A
pile of forwards is a leak only beyond what the job's backwards have shown they consume."""

FORECAST = "1.9"
"""The time-to-OOM forecast states its uncertainty: the earliest plausible time beside the central
one, the kind of rise it is made for (a steady leak, a stair leak, a growing demand), and the reason
where there is none (too few rows, too noisy, no rise)."""

OBSERVED = "1.10"
"""What the job itself shows across its steps and backwards: the gradients and optimizer state held at each
step row and the most one forward took in since the row before (two more row columns), the memory left after
each backward since the last optimizer step (an accumulation window), and the parameters of a mixture of
experts' experts. State that appears as parameters start to train is told from a leak, a step's own demand
that grew with its input from one that grew inside the model (routing), outputs kept through a window from
its activations."""

CENSUS = "1.11"
"""A census at the OOM, read from the job's own objects: parameters by module and whether an optimizer holds
them, tensors with a graph and detached tensors by what holds them (a list, a module attribute, a frame's local,
a framework's container; a bounded ``deque`` with its cap), the computation in flight, and the GPU's other
processes split into the job's own children, its launcher's other ranks and other tenants."""

OUTCOME_CHOICES = ("pending", "recovered", "fatal")
KINDS = ("int", "number", "time", "str", "bool", "any", "object", "map", "list")
"""``int`` within ±2**63; ``number`` finite; ``time`` Unix seconds within ±2**33;
``map`` an object of arbitrary keys whose values are ``items``; ``list`` of ``items``."""
ITEM_KINDS = ("int", "number", "str", "bool", "any", "row")
"""``row``: a list of finite numbers (booleans allowed), one row of a table of samples."""
LABEL_MAX_CHARS = 512
"""The most characters of a string the sidecar serves as a label value (issue 44). 512 characters are at
most 2,048 bytes of UTF-8: within the 2,048 bytes Mimir and Cortex accept by default
(``-validation.max-length-label-value``), and many times a GPU UUID (40), a MIG UUID (44) or a version; a
profiler's templated CUDA kernel name can pass it, and then its profile is refused (docs/scale.md)."""


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    kind: str
    doc: str
    required: bool = False
    nullable: bool = False
    table: Optional[Table] = None
    """The nested object of an ``object`` field, or the item of a ``list`` of objects."""
    items: Optional[str] = None
    """The values of a ``map`` or the items of a ``list`` of scalars (``ITEM_KINDS``)."""
    since: Optional[str] = None
    """The revision the key appeared in; None: with its table."""
    default: Any = None
    """What a reader sees when an optional key is absent (a fresh copy for lists and maps)."""
    choices: tuple[str, ...] = ()
    """The only values a reader accepts (closed sets only; open ones are listed in ``doc``)."""
    counter: bool = False
    """Served by a counter family (an ``int`` or ``number``, or the values of a ``map``): a reader accepts
    only values >= 0 (issue 44: a counter is never negative, and every number of the table is finite)."""
    label: bool = False
    """Served as a label value (a ``str``, or the keys of a ``map``): a reader accepts at most
    :data:`LABEL_MAX_CHARS` characters."""


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    """The ``TypedDict`` of this object in ``oomsight.wire.documents``."""
    doc: str
    fields: tuple[Field, ...]
    since: str = BASE
    kind: Optional[str] = None
    """The ``kind`` of a top-level document."""

    def field_since(self, f: Field) -> str:
        return f.since or self.since


def default_of(f: Field) -> Any:
    """What a reader sees when the optional key ``f`` is absent (a fresh copy)."""
    if f.default is not None:
        return copy.copy(f.default)
    return {"list": [], "map": {}}.get(f.kind) if not f.nullable else None


def req(name: str, kind: str, doc: str, **kw: Any) -> Field:
    return Field(name, kind, doc, required=True, **kw)


def opt(name: str, kind: str, doc: str, **kw: Any) -> Field:
    return Field(name, kind, doc, **kw)


def nullable(name: str, kind: str, doc: str, required: bool = False, **kw: Any) -> Field:
    return Field(name, kind, doc, required=required, nullable=True, **kw)
