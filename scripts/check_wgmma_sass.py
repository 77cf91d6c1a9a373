#!/usr/bin/env python3
"""Checks the sm_90a machine code of our wgmma kernels: registers an issued product still owns, serialised wgmma.

A wgmma runs after it is issued, until a `wgmma.wait_group` (WARPGROUP.DEPBAR in SASS) retires its
group: until then its accumulators and its A operand in registers must not be written, nor its
accumulators read. The PTX says so, but ptxas itself allocates the registers, and CUDA 13.0's ptxas
can give an A operand's registers to other values once the product is issued (they look dead to it):
seen in a version of the attention forward that made the next tile's P while the product ran, where
the exponentials were written into the registers the product was reading. Nothing fails at compile
time; the product's result is then wrong. This reads the SASS (cuobjdump) and reports every such
access.

    scripts/check_wgmma_sass.py OBJECT_OR_DIR...    every .o / .cubin (a directory: those below it)
    scripts/check_wgmma_sass.py --sass FILE         a listing as cuobjdump -sass prints it
    scripts/check_wgmma_sass.py --cuobjdump         prints the cuobjdump it would run

A function whose every product is waited for right after its issue is reported too: ptxas
serialises a kernel's wgmma so where it cannot keep them in flight (registers, a branch), and says
so only in "ptxas info (C75xx)" lines, which -Werror does not stop.

Each function that issues HGMMA is scanned in address order, with the products in flight carried
through straight-line code; a loop's back-edge with products in flight is followed once more, so the
loop's start is checked against the products of its end. Branches are otherwise not followed (a
forward branch over a wait is read as if the wait ran), so a clean report is evidence, not proof.
Exit status: 0 clean, 1 an access or a serialised function found, 2 no function with HGMMA found,
cuobjdump missing or failing, or wrong arguments. cuobjdump and the nvdisasm it runs come from
$CUDA_HOME/bin, the PATH, or NVIDIA's pip packages nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm.
"""
import concurrent.futures
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
REGISTER = re.compile(r"^[-|!]*R(\d+)\b")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")  # an instruction's guard, before its opcode


def is_product(text):
    return PREDICATE.sub("", text).startswith("HGMMA")


def cuobjdump():
    """cuobjdump, from a directory that also holds the nvdisasm it runs."""
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"),
                  shutil.which("cuobjdump") or ""]
    spec = importlib.util.find_spec("nvidia")  # the pip packages' namespace, if installed
    for root in (spec.submodule_search_locations if spec else []):
        candidates += sorted(glob.glob(os.path.join(root, "cu*", "bin", "cuobjdump")))
    for path in candidates:
        if path and os.access(path, os.X_OK) and os.access(os.path.join(os.path.dirname(path), "nvdisasm"), os.X_OK):
            return path
    print("check_wgmma_sass.py: no cuobjdump beside an nvdisasm in $CUDA_HOME/bin, on the PATH or among "
          "python3's packages: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (scripts/setup.sh does)",
          file=sys.stderr)
    sys.exit(2)


def registers(operand, count):
    m = REGISTER.match(operand.strip())
    return set(range(int(m.group(1)), int(m.group(1)) + count)) if m else set()


def written_count(opcode):
    """How many registers an instruction writes from its first operand (the wide loads and products)."""
    if ".128" in opcode or re.search(r"^LDSM\..*\.4\b", opcode):
        return 4
    if ".64" in opcode or ".WIDE" in opcode or re.search(r"^LDSM\..*\.2\b", opcode):
        return 2
    return 1


def functions(listing):
    """(name, [(address, text)]) of each function of a cuobjdump -sass listing."""
    for chunk in listing.split("Function : ")[1:]:
        lines = chunk.split("\n")
        code = [(int(m.group(1), 16), m.group(2)) for m in map(INSTRUCTION.match, lines[1:]) if m]
        yield lines[0].strip(), code


def scan(code):
    """The accesses to registers of products in flight, as (address, instruction, registers, issued at)."""
    at = {address: i for i, (address, _) in enumerate(code)}
    groups, current, found, followed = [], None, [], set()
    i = 0
    while i < len(code):
        address, text = code[i]
        i += 1
        body = PREDICATE.sub("", text)
        opcode = body.split()[0]
        operands = [o.strip() for o in body[len(opcode):].split(",")]
        branch = re.search(r"\bBRA\b.*?0x([0-9a-f]+)\s*$", body)
        if branch and int(branch.group(1), 16) < address and groups and address not in followed:
            followed.add(address)
            i = at.get(int(branch.group(1), 16), i)
            continue
        if opcode.startswith("HGMMA"):
            n = int(re.search(r"\.64x(\d+)x", opcode).group(1))
            accumulators = n // 2 if ".F32" in opcode else n // 4
            current = current or {"a": set(), "acc": set(), "issued": address}
            current["acc"] |= registers(operands[0], accumulators)
            current["a"] |= registers(operands[1], 4)
            if "gsb0" in operands[-1]:
                groups.append(current)
                current = None
            continue
        if opcode.startswith("WARPGROUP.DEPBAR"):
            keep = int(operands[-1], 16)
            groups = groups[len(groups) - keep:] if keep else []
            continue
        if opcode.startswith("WARPGROUP") or not groups or not operands[0]:
            continue
        writes = registers(operands[0], written_count(opcode))
        reads = set().union(*(registers(o, 1) for o in operands[1:]))
        for group in groups:
            hit = (writes & (group["a"] | group["acc"])) | (reads & group["acc"])
            if hit:
                found.append((address, text, sorted(hit), group["issued"]))
    return found


def serialised(code):
    """Whether every product is waited for alone, right after its issue: what ptxas makes of a kernel's
    wgmma when it cannot keep them in flight (its "ptxas info (C75xx)" lines, which are not warnings)."""
    issued = [i for i, (_, text) in enumerate(code) if is_product(text)]
    def waited_alone(i):  # its own group, retired before the next product is issued
        for _, text in code[i + 1:]:
            if re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", text):
                return "gsb0" in code[i][1]
            if is_product(text):
                return False
        return False
    return len(issued) > 1 and all(map(waited_alone, issued))


def main(argv):
    if argv == ["--cuobjdump"]:
        print(cuobjdump())
        return 0
    if argv[:1] == ["--sass"] and len(argv) == 2:
        listings = [(argv[1], open(argv[1]).read())]
    elif argv and not argv[0].startswith("-"):
        files = []
        for path in argv:
            files += sorted(glob.glob(os.path.join(path, "**", "*.o"), recursive=True) +
                            glob.glob(os.path.join(path, "**", "*.cubin"), recursive=True)) if os.path.isdir(path) else [path]
        tool = cuobjdump()
        env = dict(os.environ, NVDISASM_PATH=os.path.dirname(tool))
        # Only sm_90a code has wgmma; the objects' other architectures are not disassembled.
        dump = lambda f: subprocess.run([tool, "-sass", "-arch", "sm_90a", f], capture_output=True, text=True, env=env)
        listings = []
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            for f, run in zip(files, pool.map(dump, files)):
                if run.returncode == 0:
                    listings.append((f, run.stdout))
                elif "does not contain device code" not in run.stderr:
                    print(f"check_wgmma_sass.py: {tool} -sass {f}: {run.stderr.strip()}", file=sys.stderr)
                    return 2
    else:
        print("usage:\n" + __doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    checked = accesses = serial = 0
    for source, listing in listings:
        for name, code in functions(listing):
            if not any(is_product(text) for _, text in code):
                continue
            checked += 1
            if serialised(code):
                serial += 1
                print(f"{source}: {name}: every wgmma waited for alone: ptxas serialised them")
            for address, text, hit, issued in scan(code):
                accesses += 1
                print(f"{source}: {name}: {address:04x} {text}: registers {hit} of the product issued at {issued:04x}")
    if checked == 0:
        print("check_wgmma_sass.py: no function issues HGMMA in what was given", file=sys.stderr)
        return 2
    print(f"{checked} functions with wgmma checked: {accesses} accesses to registers of products in flight, "
          f"{serial} serialised")
    return 1 if accesses or serial else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
