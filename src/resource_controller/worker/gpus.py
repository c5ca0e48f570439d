"""A host's GPUs as ``nvidia-smi`` reports them: the ``--query-gpu`` answer and the
``-L`` listing of GPUs and MIG instances::

    GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-145f656c-76cc-1d7a-ed52-c2b21bbbb90b)
      MIG 3g.20gb     Device  0: (UUID: MIG-414beea8-db80-5873-9762-84efefa8037b)

(R450 drivers write ``MIG-GPU-<uuid>/<gi>/<ci>``). Damaged output never raises: an
unreadable MIG line still puts its GPU in MIG mode, its instance *unknown*, not absent.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from resource_controller.core import mig

LIST_ARGS = ("-L",)
#: Exactly this query, so the four fields arrive in this order (PROBE-010).
QUERY_ARGS = (
    "--query-gpu=name,memory.total,memory.free,driver_version",
    "--format=csv,noheader,nounits",
)

_GPU = re.compile(r"GPU\s+([0-9]+):\s*(.*?)\s*\(UUID:\s*(GPU-[^\s()]+)\)", re.ASCII)
_GPU_CUT = re.compile(r"GPU\s+([0-9]+):\s*([^(]*)", re.ASCII)
_MIG = re.compile(r"MIG\s+(\S+)\s+Device\s+([0-9]+):\s*\(UUID:\s*(MIG-[^\s()]+)\)", re.ASCII)
_PROFILE_MEMORY = re.compile(r"([0-9]+)gb", re.ASCII | re.IGNORECASE)


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a GPU instance with its compute instance) of one GPU."""

    gpu: int
    index: int  #: the MIG device index ``j`` of ``Device  j:``
    profile: str  #: ``3g.20gb``, ``1c.3g.40gb``, ``1g.10gb+me``
    uuid: str  #: what ``CUDA_VISIBLE_DEVICES`` takes for it

    @property
    def name(self) -> str:
        return mig.instance_name(self.gpu, self.index)


@dataclass(frozen=True)
class Gpu:
    """One GPU line, with the MIG devices listed under it."""

    index: int
    model: str
    uuid: str = ""  #: ``""`` when its line was cut short
    migs: tuple[MigDevice, ...] = ()
    unreadable: int = 0

    @property
    def name(self) -> str:
        return mig.gpu_name(self.index)

    @property
    def mig_mode(self) -> bool:
        """MIG devices are listed under it (EXT-MIG-1: that is what MIG mode means here)."""
        return bool(self.migs) or self.unreadable > 0

    def instance(self, index: int) -> MigDevice | None:
        return next((m for m in self.migs if m.index == index), None)


def instance_vram(profile: str) -> str | None:
    """``3g.40gb`` → ``40G``, which ``vram>=40G`` admits; ``None`` (no label, never a
    guess) for a profile that names no memory."""
    found = _PROFILE_MEMORY.findall(profile)
    return f"{found[-1]}G" if found else None


@dataclass(frozen=True)
class Inventory:
    """What one ``nvidia-smi -L`` listed, by GPU index."""

    gpus: tuple[Gpu, ...] = ()

    def gpu(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def device_names(self) -> list[str]:
        """``gpu<i>``, or a MIG-mode GPU's instances ``gpu<i>.mig<j>``, in index order."""
        names: list[str] = []
        for g in sorted(self.gpus, key=lambda g: g.index):
            if g.mig_mode:
                names.extend(m.name for m in sorted(g.migs, key=lambda m: m.index))
            else:
                names.append(g.name)
        return names

    def instance(self, name: str) -> MigDevice | None:
        parsed = mig.parse(name)
        if parsed is None or parsed[1] is None:
            return None
        g = self.gpu(parsed[0])
        return g.instance(parsed[1]) if g is not None else None

    def mig_uuids(self) -> dict[str, str]:
        return {m.name: m.uuid for g in self.gpus for m in g.migs}

    def unknown(self, name: str) -> bool:
        """``name`` may be the instance of an unreadable MIG line."""
        parsed = mig.parse(name)
        if parsed is None or parsed[1] is None:
            return False
        g = self.gpu(parsed[0])
        return g is not None and g.unreadable > 0 and g.instance(parsed[1]) is None

    def missing(self, name: str) -> bool:
        """``name`` is ``gpu<i>`` and this listing, which lists some GPU, lists no GPU i."""
        parsed = mig.parse(name)
        return (
            parsed is not None
            and parsed[1] is None
            and bool(self.gpus)
            and self.gpu(parsed[0]) is None
        )

    def conflict(self, name: str) -> str:
        """Why ``name`` cannot stand for silicon on this host; ``""`` if it can. A missing
        GPU conflicts only for its instances (no UUID to give a job)."""
        parsed = mig.parse(name)
        if parsed is None:
            return ""
        index, j = parsed
        g = self.gpu(index)
        if j is None:
            if g is None or not g.mig_mode:
                return ""
            listed = ", ".join(m.name for m in g.migs)
            return f"GPU {index} is in MIG mode" + (
                f": its MIG devices are {listed}, not the whole GPU" if listed else ""
            )
        if g is None:
            return f"nvidia-smi lists no GPU {index}" if self.gpus else "nvidia-smi lists no GPU"
        if not g.mig_mode:
            return f"GPU {index} is not in MIG mode: it is offered whole, as {g.name}"
        if g.instance(j) is None and not g.unreadable:
            listed = ", ".join(m.name for m in g.migs)
            return f"GPU {index} has no MIG device {j} (its MIG devices are {listed})"
        return ""


def parse_list(text: str) -> tuple[Inventory, list[str]]:
    """``nvidia-smi -L`` output as an ``Inventory``, and warnings for what it skipped."""
    gpus: dict[int, Gpu] = {}  # a GPU listed again keeps its first place
    warnings: list[str] = []
    current: int | None = None
    for n, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("GPU "):
            whole = _GPU.fullmatch(line)
            if whole is not None:
                index, model, uuid = int(whole.group(1)), whole.group(2), whole.group(3)
            else:
                cut = _GPU_CUT.match(line)
                if cut is None:
                    warnings.append(f"nvidia-smi -L line {n} unreadable: {line[:200]!r}")
                    current = None
                    continue
                index, model, uuid = int(cut.group(1)), cut.group(2).strip(), ""
                warnings.append(f"nvidia-smi -L line {n} has no UUID for GPU {index}")
            if index in gpus:
                warnings.append(f"nvidia-smi -L lists GPU {index} twice; the last line counts")
            gpus[index] = Gpu(index, model, uuid)
            current = index
        elif line.startswith("MIG "):
            if current is None:
                warnings.append(
                    f"nvidia-smi -L line {n}: a MIG device under no GPU: {line[:200]!r}"
                )
                continue
            g = gpus[current]
            m = _MIG.fullmatch(line)
            if m is None:
                warnings.append(
                    f"nvidia-smi -L line {n}: MIG device of GPU {current} unreadable: {line[:200]!r}"
                )
                gpus[current] = dataclasses.replace(g, unreadable=g.unreadable + 1)
                continue
            device = MigDevice(current, int(m.group(2)), m.group(1), m.group(3))
            if g.instance(device.index) is not None:
                warnings.append(
                    f"nvidia-smi -L lists MIG device {device.index} of GPU {current} twice"
                )
                continue
            gpus[current] = dataclasses.replace(g, migs=(*g.migs, device))
        else:
            warnings.append(f"nvidia-smi -L line {n} skipped: {line[:200]!r}")
    return Inventory(tuple(gpus.values())), warnings


def instance_facts(
    inventory: Inventory, gpu_facts: Mapping[str, str], names: Collection[str]
) -> dict[str, str]:
    """``gpu<i>.mig<j>.*`` facts of every listed instance among ``names``, with its parent
    GPU's from ``gpu_facts`` (the model from the ``-L`` line when the query had none)."""
    facts: dict[str, str] = {}
    for g in inventory.gpus:
        parent = g.name
        for m in g.migs:
            if m.name not in names:
                continue
            own = {
                "vendor": "nvidia",
                "model": gpu_facts.get(f"{parent}.model") or g.model,
                "driver": gpu_facts.get(f"{parent}.driver", ""),
                "mig_profile": m.profile,
                "vram": instance_vram(m.profile) or "",
                "parent": parent,
                "uuid": m.uuid,
            }
            facts.update({f"{m.name}.{k}": v for k, v in own.items() if v})
    return facts


def conflicts(inventory: Inventory, names: Collection[str]) -> dict[str, str]:
    """Configured name → why it conflicts with its GPU's MIG mode."""
    return {name: why for name in names if (why := inventory.conflict(name))}


def parse_nvidia_smi(text: str) -> tuple[dict[str, str], list[str]]:
    """nvidia-smi's CSV answer as ``gpu<i>.*`` facts, and warnings (PROBE-012); line *i*
    is GPU *i*, a bad line still consuming its index, memory in ``M`` (MiB)."""
    facts: dict[str, str] = {}
    warnings: list[str] = []
    for i, raw in enumerate(text.strip().splitlines()):
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            warnings.append(f"nvidia-smi line {i} has {len(fields)} fields, not 4: {line[:200]!r}")
            continue
        name, total, free, driver = fields
        facts[f"gpu{i}.vendor"] = "nvidia"
        facts[f"gpu{i}.model"] = name
        facts[f"gpu{i}.vram"] = total + "M"
        facts[f"gpu{i}.vram_free"] = free + "M"
        facts[f"gpu{i}.driver"] = driver
    return facts, warnings


def merged_facts(
    listed: Inventory, facts: Mapping[str, str], names: Sequence[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """The query's facts with the listing's, and the names in conflict: a MIG-mode GPU's
    whole-GPU facts go only to a device named for it, which is in conflict."""
    named = set(names)
    out = {
        k: v
        for k, v in facts.items()
        if not _whole_gpu_in_mig_mode(k, listed) or k.partition(".")[0] in named
    }
    out.update(instance_facts(listed, facts, named))
    found = conflicts(listed, names)
    out.update({f"{name}.{mig.CONFLICT}": why for name, why in found.items()})
    return out, found


def _whole_gpu_in_mig_mode(key: str, listed: Inventory) -> bool:
    """``key`` is a whole-GPU fact (``gpu<i>.model``) of a GPU the listing has in MIG mode."""
    parsed = mig.parse(key.partition(".")[0])
    if parsed is None or parsed[1] is not None:
        return False
    g = listed.gpu(parsed[0])
    return g is not None and g.mig_mode
