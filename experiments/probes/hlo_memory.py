"""Which arrays a compiled XLA program holds at its memory peak, and the Python lines that made them.

Reads the files XLA writes when a program is compiled with the options of `dump_options(folder)`:
the live ranges (`*after_optimizations-live-range.txt`: every value live at the peak of the buffer
assignment, with its bytes) and the optimized HLO (`*after_optimizations.txt`: each instruction's
shape and metadata, whose stack frames name the source lines). A fusion's value is traced to the
fused instruction that computes it (the root, or the root tuple's operand for a multi-output
fusion's element); a copy XLA inserted (no metadata of its own) to the value it copies.
Two views: the values live together at the peak of the schedule (what the program needs at once),
and where the buffer assignment placed the values in its temporary allocation (what it takes: XLA:GPU's
allocation can be several times the live peak, its values packed side by side). Used by
memory_per_slot.py --breakdown (issue 20).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path


def dump_options(folder) -> dict:
    """compile(compiler_options=...) that make XLA write the program's HLO and buffer assignment to folder."""
    return {"xla_dump_to": str(folder), "xla_dump_hlo_as_text": True, "xla_dump_hlo_module_re": ".*"}


_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = ")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def _split_top(text: str, sep: str = ",") -> list[str]:
    """text split at `sep` outside (), [], {} and quotes."""
    parts, depth, quoted, cur = [], 0, False, []
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([{":
            depth += 1
        elif not quoted and ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0 and not quoted:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _tuple_element(shape: str, index: tuple) -> str:
    for i in index:
        shape = re.sub(r"/\*index=\d+\*/", "", _split_top(shape[1:-1])[i])
    return re.sub(r"\{[^}]*\}$", "", shape)  # no layout


def _closing(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] in "([{"
        depth -= text[i] in ")]}"
        if depth == 0:
            return i + 1
    return len(text)


class Hlo:
    """The optimized HLO module's instructions (shape, opcode, operands, called computation,
    metadata) and its stack frames."""

    def __init__(self, text: str):
        self.instr, self.root = {}, {}
        comp = None
        for line in text.splitlines():
            if re.match(r"^(ENTRY )?%\S+ .*\{$", line):
                comp = line.split("%", 1)[1].split(" ", 1)[0]
                continue
            m = _INSTR.match(line)
            if not m:
                continue
            rest = line[m.end():]
            end = _closing(rest, 0) if rest.startswith("(") else rest.index(" ")
            shape, rest = rest[:end], rest[end:].strip()
            op = rest[:rest.index("(")]
            args = rest[len(op):_closing(rest, len(op))][1:-1]
            meta = re.search(r"metadata=\{([^}]*)\}", rest)
            meta = meta.group(1) if meta else ""
            calls = re.search(r"calls=%([\w.-]+)", rest)
            self.instr[m.group(1)] = dict(
                shape=shape, op=op, operands=re.findall(r"%([\w.-]+)", args), calls=calls and calls.group(1),
                op_name=(re.search(r'op_name="([^"]*)"', meta) or [None, ""])[1],
                frame=int((re.search(r"stack_frame_id=(\d+)", meta) or [None, 0])[1]))
            if line.lstrip().startswith("ROOT"):
                self.root[comp] = m.group(1)
        self.frames = self._frames(text)

    @staticmethod
    def _frames(text: str) -> dict:
        """stack frame id -> (file, function, line, parent id); the module header's tables."""
        def table(name):
            m = re.search(rf"^{name}\n(.*?)\n\n", text, re.S | re.M)
            return [(int(ln.split()[0]), ln.split(None, 1)[1]) for ln in m.group(1).splitlines()] if m else []

        files = {i: s.strip('"') for i, s in table("FileNames")}
        funcs = {i: s.strip('"') for i, s in table("FunctionNames")}
        field = lambda s, k: int(re.search(rf"{k}=(\d+)", s).group(1))
        locs = {i: (files[field(s, "file_name_id")], funcs[field(s, "function_name_id")], field(s, "line"))
                for i, s in table("FileLocations")}
        # parent_frame_id counts from 1 in the text: frame k's parent is frame parent_frame_id - 1 (0: none)
        return {i: (*locs[field(s, "file_location_id")], field(s, "parent_frame_id") - 1) for i, s in table("StackFrames")}

    def stack(self, frame: int, within: str = "pauliprop/") -> list[str]:
        """'file:line function' of the frames under `within`, innermost first."""
        out = []
        while frame in self.frames and len(out) < 64:
            path, func, line, frame = self.frames[frame]
            if within in path:
                out.append(f"{path.split(within)[-1] if within else path}:{line} {func.split('.')[-1]}")
        return out

    def source(self, name: str, index: tuple = ()) -> tuple[str, dict]:
        """(the value's shape, the instruction that computes it): through a fusion to its fused
        root (the tuple element's operand), through an inserted copy to what it copies (its op then
        reads "copy of ...")."""
        ins = self.instr[name]
        shape = _tuple_element(ins["shape"], index) if index else re.sub(r"\{[^}]*\}$", "", ins["shape"])
        ops = []
        while len(ops) < 16:
            ops.append(ins["op"])
            if ins["op"] == "fusion" and ins["calls"] in self.root:
                root = self.instr[self.root[ins["calls"]]]
                if root["op"] == "tuple" and index:
                    root, index = self.instr[root["operands"][index[0]]], index[1:]
                if root["frame"] or not ins["frame"]:
                    ins = root
                    continue
            if ins["op"] in ("copy", "bitcast") and not ins["frame"] and ins["operands"]:
                ins = self.instr[ins["operands"][0]]
                continue
            break
        ops = [o for o in ops if o != "fusion"] or ops
        return shape, ins | {"op": " of ".join(dict.fromkeys(ops))}


def _newest(folder: Path, module: str, suffix: str) -> Path:
    files = sorted(folder.glob(f"*{module}*after_optimizations{suffix}"),
                   key=lambda p: int(re.match(r"module_(\d+)", p.name).group(1)))
    if not files:
        raise FileNotFoundError(f"no {suffix} dump of {module} in {folder}")
    return files[-1]


def _row(hlo: Hlo, name: str, index: tuple, size: int, capacity: int) -> dict:
    shape, src = hlo.source(name, index)
    return dict(value=name + (str(list(index)).replace(" ", "") if index else ""), shape=shape,
                bytes_per_slot=size / capacity, op=src["op"], op_name=src["op_name"], source=hlo.stack(src["frame"])[:6])


def temp_placement(folder, capacity: int, module: str = "jit__forward", min_per_slot: float = 0.5,
                   top: int = 40) -> dict:
    """Where the buffer assignment put the values of its largest temporary allocation: one row per
    place (offset and size) that values of at least min_per_slot bytes a slot share over time, the
    largest `top` first, with how many values share it and one of them (its source); `covered_per_slot`:
    the bytes a slot those places cover together."""
    folder = Path(folder)
    path = _newest(folder, module, "-buffer-assignment.txt")
    hlo = Hlo(Path(str(path).replace("-buffer-assignment", "")).read_text())
    allocs, cur = [], None
    for line in path.read_text().splitlines():
        a = re.match(r"allocation \d+: size (\d+), (.*)", line)
        if a:
            cur = dict(size=int(a.group(1)), temp="preallocated-temp" in a.group(2), values=[])
            allocs.append(cur)
            continue
        v = re.match(r" value: <\d+ (\S+?)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)", line)
        if v and cur is not None:
            cur["values"].append((v.group(1), v.group(2), int(v.group(3)), int(v.group(4))))
    temps = [a for a in allocs if a["temp"]]
    if not temps:
        return dict(temp_allocation_per_slot=0.0, places=[])
    alloc = max(temps, key=lambda a: a["size"])
    places = defaultdict(list)
    for name, index, size, offset in alloc["values"]:
        if size >= min_per_slot * capacity and name in hlo.instr:
            places[offset, size].append((name, tuple(int(i) for i in index[1:-1].split(",") if i) if index else ()))
    rows, covered, reach = [], 0, 0
    for (offset, size), members in sorted(places.items()):
        covered += max(0, offset + size - max(offset, reach))
        reach = max(reach, offset + size)
        # the member to show: one computed by a source line, not a copy or a loop's phi
        rows.append(_row(hlo, *max(members, key=lambda m: bool(hlo.source(*m)[1]["frame"])), size, capacity)
                    | dict(offset_per_slot=offset / capacity, sharing=len(members)))
    rows.sort(key=lambda r: (-r["bytes_per_slot"], r["offset_per_slot"]))
    return dict(temp_allocation_per_slot=alloc["size"] / capacity, covered_per_slot=covered / capacity, places=rows[:top])


def peak_values(folder, capacity: int, module: str = "jit__forward", min_per_slot: float = 0.5,
                top: int = 40) -> dict:
    """The values live at the peak of the newest dumped program whose name contains `module`, as
    rows (value, shape, bytes per slot, op name, source lines), the largest `top` first; the others
    summed (`smaller_per_slot`), and the bytes a slot by source line."""
    path = _newest(Path(folder), module, "-live-range.txt")
    text = path.read_text()
    hlo = Hlo(Path(str(path).replace("-live-range", "")).read_text())
    m = re.search(r"Live ranges at (\d+) \(peak\):\n(.*?)\n  \S", text, re.S)
    rows, rest = [], 0
    for line in m.group(2).splitlines():
        v = re.match(r"\s*(\S+?)(\{[\d,]*\})?: (\d+) bytes", line)
        if not v:
            continue
        name, index, size = v.group(1), v.group(2), int(v.group(3))
        if size < min_per_slot * capacity or name not in hlo.instr:
            rest += size
            continue
        rows.append(_row(hlo, name, tuple(int(i) for i in index[1:-1].split(",") if i) if index else (), size,
                         capacity))
    rows.sort(key=lambda r: -r["bytes_per_slot"])
    by_line = defaultdict(float)
    for r in rows:
        by_line[r["source"][0] if r["source"] else f"({r['op']}, no source)"] += r["bytes_per_slot"]
    rest += capacity * sum(r["bytes_per_slot"] for r in rows[top:])
    return dict(peak_position=int(m.group(1)), peak_per_slot=sum(r["bytes_per_slot"] for r in rows[:top]) + rest / capacity,
                smaller_per_slot=rest / capacity, values=rows[:top],
                by_line=sorted(([k, v] for k, v in by_line.items()), key=lambda kv: -kv[1]))
