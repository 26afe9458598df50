"""Write the student repository from the reference solution:  python -m common.tools.release --out DIR

The repository holds the complete solution. Every piece a student writes is a *solution
region*: a comment line BEGIN SOLUTION (`#` in Python, `//` in CUDA/C++; `// BEGIN SOLUTION
kernel` inside a `__global__`/`__device__` body), then the hint lines the student will see
(`# HINT: ...` / `// HINT: ...`), then the solution code, then a comment line END SOLUTION,
at any indentation, as whole statements inside one function body. Release replaces each
region by its hint lines (at the region's indentation) plus

    Python               raise NotImplementedError("Task N: <function> is not implemented yet; ...")
    CUDA/C++ host code   TORCH_CHECK_NOT_IMPLEMENTED(false, "Task N: <function> is not implemented yet; ...");
    kernel / device code nothing (an empty kernel body still compiles)

so the student repository imports, compiles, and its tests fail with a "not implemented"
message instead of crashing. TORCH_CHECK_NOT_IMPLEMENTED is TORCH_CHECK raising Python's
NotImplementedError (a subclass of RuntimeError), which the test harness reports per check.
"Task N" comes from the folder name, <function> from the function around the region.

What the student repository holds (decided here, documented in README.md, For instructors):
  * every file git tracks or would track (untracked files that .gitignore does not ignore),
    so a task folder that is not committed yet is released too; without git, a walk that
    skips build outputs and caches;
  * solution files (under task*/ and common/, with at least one region) rewritten;
  * Results.md reset to the blank template (common.tools.report.render(blank=True));
  * README.md rewritten as the student's handout (`student_readme`): the passages between
    `<!-- release: drop -->` and `<!-- release: end -->` (the instructors' section, the
    references to what only the solution has: results/logs/, NOTES.md, measured numbers)
    are left out, the text of each `<!-- release: student ... -->` comment is shown in
    their place, and its Layout block names only what the release ships (not results/);
  * dropped: measured results (results/: the JSON, CSV and plots of the reference run),
    NOTES*.md files (they discuss how the solution was made fast: task4/NOTES.md), and
    scratch folders (.notes/, .benchmarks/, build/, student/);
  * kept: the grader, the tests, common/ (with common/tools/), CI.

Then a leak check reads the whole output: a line of solution code (40 characters or more,
using a solution-only name) that appears anywhere, a solution-only identifier (a name with `_`, a digit or camelCase
that appears only inside regions, e.g. a local variable) in a document, or a marker line
left behind fails the release, naming file and line. A solution-only identifier in some
other code file (a test, a kernel without regions) is printed as a note: it may be a shared
name, or a file that should carry regions. README.md (the handout) and hint lines are
public by definition.

    python -m common.tools.release --out ../attention-student          # write the student repo
    python -m common.tools.release --out ../attention-student --force  # replace it (keeps its .git)
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.release")

import argparse
import ast
import fnmatch
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# The marker words are assembled, so that no line of this file is itself a marker line.
_SOL = "SOL" + "UTION"
_MARKER = re.compile(r"^(?P<indent>[ \t]*)(?P<comment>#|//)[ \t]*(?P<word>BEGIN|END)[ \t]+"
                     + _SOL + r"\b(?P<rest>.*)$")
_HINT = re.compile(r"^[ \t]*(?:#|//)[ \t]*HINT:")

PY_SUFFIXES = {".py"}
C_SUFFIXES = {".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp"}
CODE_SUFFIXES = PY_SUFFIXES | C_SUFFIXES | {".sh", ".toml", ".cfg", ".ini", ".yaml", ".yml"}
SOLUTION_DIRS = re.compile(r"^(task\d+|common)/")   # where files with regions may live
HANDOUT = "README.md"                               # public by definition (its student version)
# README.md's release markers (HTML comments: invisible where the README is rendered).
_DROP_BEGIN = re.compile(r"^<!--\s*release:\s*drop\s*-->\s*$")
_DROP_END = re.compile(r"^<!--\s*release:\s*end\s*-->\s*$")
_STUDENT = re.compile(r"^<!--\s*release:\s*student\b(?P<rest>.*)$")

# (pattern over the relative path, why it is not shipped). fnmatch: `*` also matches `/`.
DROP = (
    ("results/*", "measured results of the reference solution (Results.md is reset instead)"),
    ("Results.md", "replaced by the blank template"),
    ("NOTES*.md", "notes on how the solution was made fast"),
    ("*/NOTES*.md", "notes on how the solution was made fast"),
    (".notes/*", "scratch notes"),
    (".benchmarks/*", "scratch benchmarks"),
    ("build/*", "build outputs"),
    ("student/*", "a previous release output"),
)
# Folders and files a walk (no git) never copies; git ignores the same ones.
WALK_SKIP_DIRS = {".git", "build", "student", "__pycache__", ".pytest_cache", ".ruff_cache",
                  ".mypy_cache", ".whl", ".gl", ".notes", ".benchmarks", ".venv", "venv"}
WALK_SKIP_SUFFIXES = {".pyc", ".pyo", ".so", ".o"}

# Leak check: region lines at least this long are "solution code" wherever they reappear.
LEAK_MIN_LINE = 40
# Names that are shared vocabulary (APIs, CUDA built-ins), never evidence of a leak.
SHARED_NAMES = frozenset({
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "size_t", "int64_t", "int32_t",
    "uint32_t", "uint64_t", "int16_t", "uint16_t", "int8_t", "uint8_t", "nv_bfloat16",
    "nv_bfloat162", "half2", "float2", "float4", "int2", "int4", "uint2", "uint4", "static_cast",
    "reinterpret_cast", "const_cast", "scalar_t", "data_ptr", "make_float2", "make_float4",
    "exp2f", "log2f", "expf", "fmaxf", "fminf", "sqrtf", "rsqrtf", "isinstance", "keepdim",
    "masked_fill", "float32", "float16", "bfloat16", "float64", "is_cuda", "num_heads",
    "hidden_dim", "head_dim",
})


class MarkerError(ValueError):
    """A solution region is malformed; the message starts with `path:line:`."""


class ReleaseError(RuntimeError):
    """The release cannot be written or would leak the solution; the message says where."""


@dataclass
class Region:
    path: str            # relative to the repository root, posix
    begin: int           # 1-based line of the BEGIN marker
    end: int             # 1-based line of the END marker
    indent: str
    comment: str         # "#" or "//"
    kind: str            # "python", "host" or "kernel"
    hints: list[str]     # the hint lines, stripped of their indentation
    code: list[str]      # the solution lines (everything else between the markers)
    function: str = ""   # the function around the region, for the message


@dataclass
class Finding:
    path: str
    line: int
    text: str
    fatal: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclass
class Summary:
    out: Path
    copied: int = 0
    rewritten: dict[str, int] = field(default_factory=dict)   # path -> regions replaced
    kinds: dict[str, int] = field(default_factory=dict)       # kind -> regions replaced
    dropped: list[tuple[str, str]] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)         # task code shipped as written
    notes: list[Finding] = field(default_factory=list)


# --- parsing ---------------------------------------------------------------------------------

def task_label(rel: str) -> str:
    found = re.match(r"task(\d+)/", rel)
    return f"Task {found.group(1)}" if found else rel


def has_markers(text: str) -> bool:
    return any(_MARKER.match(line) for line in text.splitlines())


def parse_regions(text: str, rel: str) -> list[Region]:
    """The solution regions of one file; MarkerError (naming file and line) if malformed."""
    suffix = Path(rel).suffix
    want = "#" if suffix in PY_SUFFIXES else "//"
    lines = text.splitlines()
    regions: list[Region] = []
    current: Region | None = None
    for number, line in enumerate(lines, start=1):
        found = _MARKER.match(line)
        if not found:
            if current is not None:
                (current.hints if _HINT.match(line) else current.code).append(line)
            continue
        where = f"{rel}:{number}"
        word, rest, comment = found["word"], found["rest"].strip(), found["comment"]
        if comment != want:
            raise MarkerError(f"{where}: a {suffix} file marks regions with `{want}`, not "
                              f"`{comment}`.")
        if word == "BEGIN":
            if current is not None:
                raise MarkerError(f"{where}: BEGIN {_SOL} inside the region opened at line "
                                  f"{current.begin}; regions do not nest (close it first).")
            if rest not in ("", "kernel"):
                raise MarkerError(f"{where}: unknown region kind {rest!r}; write BEGIN {_SOL}, "
                                  f"or BEGIN {_SOL} kernel inside a kernel body.")
            if rest == "kernel" and want == "#":
                raise MarkerError(f"{where}: `kernel` regions are for CUDA/C++ files only.")
            kind = "python" if want == "#" else ("kernel" if rest else "host")
            current = Region(rel, number, 0, found["indent"], comment, kind, [], [])
        else:
            if current is None:
                raise MarkerError(f"{where}: END {_SOL} without a BEGIN {_SOL} before it.")
            if rest:
                raise MarkerError(f"{where}: unexpected text {rest!r} after END {_SOL}.")
            current.end = number
            regions.append(current)
            current = None
    if current is not None:
        raise MarkerError(f"{rel}:{current.begin}: BEGIN {_SOL} has no END {_SOL} before the "
                          "end of the file.")
    if suffix in PY_SUFFIXES:
        _name_python_functions(text, rel, regions)
    else:
        for region in regions:
            _name_c_function(text, region)
    return regions


def _name_python_functions(text: str, rel: str, regions: list[Region]) -> None:
    """Name the function around each region (Class.method); a region outside one is an error."""
    try:
        tree = ast.parse(text, filename=rel)
    except SyntaxError as err:
        raise MarkerError(f"{rel}:{err.lineno}: the solution does not parse: {err.msg}.") from err
    functions: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((child.lineno, child.end_lineno or child.lineno,
                                  prefix + child.name))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    for region in regions:
        # The function's last statement comes after the BEGIN comment when the region is in it.
        around = [f for f in functions if f[0] < region.begin <= f[1]]
        if not around:
            raise MarkerError(f"{rel}:{region.begin}: the region is not inside a function; a "
                              "region must be whole statements of one function body (the "
                              "skeleton raises NotImplementedError in its place).")
        region.function = max(around)[2]   # the innermost: the one that starts last


_CONTROL = {"for", "if", "while", "switch", "catch", "else", "do", "try", "return"}


def _blank_c_comments_and_strings(text: str) -> str:
    """`text` with comments and string/char literals replaced by spaces (newlines kept)."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        two = text[i:i + 2]
        if two == "//":
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif two == "/*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < n and text[j] != quote and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def _name_c_function(text: str, region: Region) -> None:
    """Find the function around a CUDA/C++ region (brace matching backwards from BEGIN).

    Blocks of `for`/`if`/lambdas/initialisers are stepped over; a `__global__` or
    `__device__` function makes the region device code (its replacement is empty, since a
    TORCH_CHECK cannot run on the GPU); reaching file or namespace scope is an error.
    """
    code = _blank_c_comments_and_strings(text)
    start = sum(len(line) + 1 for line in text.split("\n")[:region.begin - 1])
    depth, i = 0, start - 1
    while i >= 0:
        c = code[i]
        if c == "}":
            depth += 1
        elif c == "{" and depth > 0:
            depth -= 1
        elif c == "{":
            kind, name, header_start = _classify_block(code, i)
            if kind == "function":
                header = code[header_start:i]
                region.function = name
                if re.search(r"\b__(global|device)__\b", header):
                    region.kind = "kernel"
                return
            if kind == "scope":
                break
        i -= 1
    raise MarkerError(f"{region.path}:{region.begin}: the region is not inside a function body; "
                      "a region must be whole statements of one function (or kernel) body.")


def _classify_block(code: str, brace: int) -> tuple[str, str, int]:
    """('function', name, header start) / ('block', '', 0) / ('scope', '', 0) for a `{`."""
    j = brace - 1
    while j >= 0 and code[j].isspace():
        j -= 1
    # Trailing qualifiers and a trailing return type: `) const noexcept -> T {`.
    tail = re.search(r"\)\s*((const|noexcept|override|final|mutable)\s*)*(->\s*[\w:<>,\s*&]+)?$",
                     code[max(0, j - 200):j + 1])
    if tail:
        j = max(0, j - 200) + tail.start()
    if j < 0 or code[j] != ")":
        word = re.search(r"(\w+)\s*$", code[:j + 1])
        if word and word.group(1) in _CONTROL:
            return "block", "", 0              # else { / do { / try {
        if j < 0 or code[j] in "=,(;{}[]" or (word and word.group(1) == "return"):
            return "block", "", 0              # an initialiser, a `[&] {` lambda, a { } block
        return "scope", "", 0                  # namespace / struct / extern "C"
    # Match the parenthesis backwards to the start of the argument list.
    depth = 0
    while j >= 0:
        if code[j] == ")":
            depth += 1
        elif code[j] == "(":
            depth -= 1
            if depth == 0:
                break
        j -= 1
    before = code[:j].rstrip()
    if before.endswith("]"):
        return "block", "", 0                  # a lambda
    word = re.search(r"(\w+)$", before)
    if not word or word.group(1) in _CONTROL:
        return "block", "", 0
    delimiter = max(before.rfind(";"), before.rfind("}"), before.rfind("{"))
    return "function", word.group(1), delimiter + 1


# --- rewriting -------------------------------------------------------------------------------

def stub_lines(region: Region) -> list[str]:
    """What the student sees in place of a region: its hints, then the stub statement."""
    lines = [region.indent + hint.strip() for hint in region.hints]
    where = "see the HINT above it in" if region.hints else "see"
    message = (f"{task_label(region.path)}: {region.function or 'this part'} is not implemented "
               f"yet; {where} {region.path}.")
    if region.kind == "python":
        lines.append(f'{region.indent}raise NotImplementedError("{message}")')
    elif region.kind == "host":
        lines.append(f'{region.indent}TORCH_CHECK_NOT_IMPLEMENTED(false, "{message}");')
    return lines


def rewrite(text: str, rel: str) -> tuple[str, list[Region]]:
    """The student version of one file and the regions it replaced."""
    regions = parse_regions(text, rel)
    lines = text.splitlines()
    out: list[str] = []
    previous = 0
    for region in regions:
        out += lines[previous:region.begin - 1]
        out += stub_lines(region)
        previous = region.end
    out += lines[previous:]
    new = "\n".join(out) + ("\n" if text.endswith("\n") else "")
    if Path(rel).suffix in PY_SUFFIXES:
        try:
            compile(new, rel, "exec")
        except SyntaxError as err:
            raise MarkerError(f"{rel}:{err.lineno}: the student version does not parse "
                              f"({err.msg}); a region must be whole statements.") from err
    return new, regions


# --- the student's README ------------------------------------------------------------------

def student_readme(text: str, rel: str = HANDOUT, shipped: Container[str] | None = None) -> str:
    """README.md as the student repository ships it (see the module docstring): drop blocks
    left out, student comments unwrapped, and, given `shipped` (the top-level files and folders
    the release writes), the Layout entries of what it does not ship left out. MarkerError
    (file and line) if a marker is unbalanced."""
    out: list[str] = []
    lines = text.splitlines()
    i, dropping = 0, 0
    while i < len(lines):
        line = lines[i]
        if _DROP_BEGIN.match(line):
            if dropping:
                raise MarkerError(f"{rel}:{i + 1}: release: drop inside the drop opened at line "
                                  f"{dropping}; they do not nest.")
            dropping = i + 1
        elif _DROP_END.match(line):
            if not dropping:
                raise MarkerError(f"{rel}:{i + 1}: release: end without a release: drop before it.")
            dropping = 0
        elif found := _STUDENT.match(line):
            start, body = i + 1, [found["rest"]]
            while "-->" not in body[-1]:
                i += 1
                if i >= len(lines):
                    raise MarkerError(f"{rel}:{start}: release: student comment has no closing -->.")
                body.append(lines[i])
            body[-1] = body[-1][:body[-1].index("-->")]
            body[0] = body[0].strip()
            body = [b.rstrip() for b in body]
            if not dropping:
                out += [b for n, b in enumerate(body)
                        if b or 0 < n < len(body) - 1]   # the comment's own lines, if empty, go
        elif not dropping:
            out.append(line)
        i += 1
    if dropping:
        raise MarkerError(f"{rel}:{dropping}: release: drop has no release: end.")
    if shipped is not None:
        out = _layout_of(out, shipped)
    new = "\n".join(out)
    new = re.sub(r"\n{3,}", "\n\n", new)
    return new.rstrip("\n") + "\n"


def layout_entries(lines: list[str]) -> list[tuple[int, int, str]]:
    """The entries of the README's Layout block (the code block under `## Layout`): (first
    line, line after the entry, its path). An entry is a line starting at the margin with a
    path (`common/tools/`), then the indented lines that describe it."""
    entries: list[tuple[int, int, str]] = []
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Layout"), None)
    if start is None:
        return entries
    fences = [i for i in range(start + 1, len(lines)) if lines[i].startswith("```")][:2]
    if len(fences) < 2 or any(line.startswith("## ") for line in lines[start + 1:fences[0]]):
        return entries
    for i in range(fences[0] + 1, fences[1]):
        if lines[i][:1].strip():
            entries.append((i, i + 1, lines[i].split()[0]))
        elif entries and lines[i].strip():
            entries[-1] = (entries[-1][0], i + 1, entries[-1][2])
    return entries


def _layout_of(lines: list[str], shipped: Container[str]) -> list[str]:
    """`lines` without the Layout entries whose top-level folder or file is not shipped (the
    student repository has no results/ until a run records one)."""
    unshipped = [(first, after) for first, after, path in layout_entries(lines)
                 if path.split("/")[0] not in shipped]
    for first, after in reversed(unshipped):
        del lines[first:after]
    return lines


# --- listing and copying ---------------------------------------------------------------------

def list_files(source: Path, exclude: Path | None = None) -> list[str]:
    """Files of the repository: tracked plus untracked-but-not-ignored (git), else a walk."""
    try:
        proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                              cwd=source, capture_output=True, timeout=60)
        names = proc.stdout.decode().split("\0") if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        names = None
    if names is None:
        names = []
        for folder, dirs, files in os.walk(source):
            dirs[:] = sorted(d for d in dirs if d not in WALK_SKIP_DIRS)
            for name in files:
                if Path(name).suffix not in WALK_SKIP_SUFFIXES:
                    names.append((Path(folder) / name).relative_to(source).as_posix())
    found = []
    for name in sorted(set(filter(None, names))):
        path = source / name
        if not path.is_file():            # deleted in the working tree, or a folder link
            continue
        if exclude is not None and path.resolve().is_relative_to(exclude):
            continue
        found.append(name)
    return found


def drop_reason(rel: str) -> str | None:
    for pattern, why in DROP:
        if fnmatch.fnmatchcase(rel, pattern):
            return why
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def is_solution_candidate(rel: str) -> bool:
    return Path(rel).suffix in PY_SUFFIXES | C_SUFFIXES and bool(SOLUTION_DIRS.match(rel))


def has_solution_regions(source: Path = REPO_ROOT) -> bool:
    """Does `source` carry any marker line (the reference solution), or not (a release)?"""
    return any(is_solution_candidate(rel) and has_markers(_read_text(source / rel) or "")
               for rel in list_files(source))


def find_solution_files(source: Path = REPO_ROOT) -> dict[str, list[Region]]:
    """{path: regions} for every file of `source` that carries solution regions."""
    found = {}
    for rel in list_files(source):
        if is_solution_candidate(rel) and drop_reason(rel) is None:
            text = _read_text(source / rel)
            if text is not None and has_markers(text):
                found[rel] = parse_regions(text, rel)
    return found


def _prepare_out(out: Path, source: Path, force: bool) -> None:
    out_r, source_r = out.resolve(), source.resolve()
    if out_r == source_r or source_r.is_relative_to(out_r):
        raise ReleaseError(f"--out {out} is the repository or holds it; pick another folder.")
    if out_r.exists() and any(out_r.iterdir()):
        if not force:
            raise ReleaseError(f"{out} exists and is not empty; pass --force to replace its "
                               "contents (a .git folder in it is kept).")
        for child in out_r.iterdir():
            if child.name == ".git":
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    out_r.mkdir(parents=True, exist_ok=True)


# --- the leak check --------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_]\w*")


def identifiers(line: str) -> set[str]:
    """Names in a line, without attribute/member names (`.x`, `::x`, `->x`): those are APIs."""
    names = set()
    for found in _IDENT.finditer(line):
        start = found.start()
        if start and (line[start - 1] == "." or line[max(0, start - 2):start] in ("::", "->")):
            continue
        names.add(found.group())
    return names


def code_like(name: str) -> bool:
    """A name no English sentence uses by accident: `row_max`, `q_tile2`, `rowMax`."""
    if len(name) < 4 or name.startswith("__") or name in SHARED_NAMES:
        return False
    return "_" in name.strip("_") or any(c.isdigit() for c in name) or bool(
        re.search(r"[a-z][A-Z]", name))


def _normal(line: str) -> str:
    return " ".join(line.split())


def find_leaks(out: Path, files: Iterable[str], solutions: dict[str, list[Region]],
               public: Iterable[str], allow: Iterable[str] = ()) -> list[Finding]:
    """Scan the released files under `out` for solution text; see the module docstring.

    `public` is the text the student sees anyway (solution files outside their regions,
    hint lines, the handout). `allow` lists names or line fragments that are not leaks.
    """
    allow = set(allow)
    public_lines, public_names = set(), set()
    for line in public:
        public_lines.add(_normal(line))
        public_names |= identifiers(line)
    private_names: set[str] = set()
    code = [line for regions in solutions.values() for region in regions for line in region.code]
    for regions in solutions.values():
        for region in regions:
            public_names |= {n for h in region.hints for n in identifiers(h)}
    for line in code:
        private_names |= {n for n in identifiers(line) if code_like(n)}
    private_names -= public_names | allow
    # A long region line that uses a solution-only name is solution code wherever it appears;
    # one made of public names only (an import, a call of the public API) is not.
    private_lines = {_normal(line) for line in code
                     if len(_normal(line)) >= LEAK_MIN_LINE and _normal(line) not in public_lines
                     and identifiers(line) & private_names
                     and not any(a in _normal(line) for a in allow)}
    findings: list[Finding] = []
    shared: dict[str, tuple[list[int], set[str]]] = {}   # rel -> (lines, names): notes only
    for rel in files:
        text = _read_text(out / rel)
        if text is None:
            continue
        suffix = Path(rel).suffix
        document = suffix not in CODE_SUFFIXES
        for number, line in enumerate(text.splitlines(), start=1):
            if _HINT.match(line):
                continue
            if _MARKER.match(line) and (suffix in PY_SUFFIXES | C_SUFFIXES):
                findings.append(Finding(rel, number, "a solution marker line was left behind", True))
                continue
            if _normal(line) in private_lines:
                findings.append(Finding(rel, number, f"a line of solution code: {line.strip()!r}", True))
                continue
            names = sorted(identifiers(line) & private_names)
            if names and (document or rel in solutions):
                findings.append(Finding(rel, number, "names that appear only inside solution "
                                        f"regions: {', '.join(names)}", True))
            elif names:
                shared.setdefault(rel, ([], set()))[0].append(number)
                shared[rel][1].update(names)
    for rel, (lines, names) in shared.items():
        where = ", ".join(map(str, lines[:8])) + (", ..." if len(lines) > 8 else "")
        findings.append(Finding(rel, lines[0], f"shares solution-only names {', '.join(sorted(names))} "
                                f"(lines {where}): shared names, or a file that should carry "
                                "solution regions?", False))
    return findings


# --- the release -----------------------------------------------------------------------------

def release(out: Path, source: Path = REPO_ROOT, *, force: bool = False,
            allow: Iterable[str] = ()) -> Summary:
    """Write the student repository of `source` into `out`; ReleaseError/MarkerError if not."""
    source, out = source.resolve(), Path(out).resolve()
    files = list_files(source, exclude=out)
    # Parse everything before writing anything: a malformed region stops the release early.
    solutions: dict[str, list[Region]] = {}
    rewritten_text: dict[str, str] = {}
    for rel in files:
        if is_solution_candidate(rel) and drop_reason(rel) is None:
            text = _read_text(source / rel)
            if text is not None and has_markers(text):
                rewritten_text[rel], solutions[rel] = rewrite(text, rel)
    _prepare_out(out, source, force)
    summary = Summary(out)
    shipped = {rel.split("/")[0] for rel in files if drop_reason(rel) is None} | {"Results.md"}
    public: list[str] = []
    kept: list[str] = []
    for rel in files:
        why = drop_reason(rel)
        if why:
            summary.dropped.append((rel, why))
            continue
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in rewritten_text:
            target.write_text(rewritten_text[rel], encoding="utf-8")
            shutil.copymode(source / rel, target)
            summary.rewritten[rel] = len(solutions[rel])
            for region in solutions[rel]:
                summary.kinds[region.kind] = summary.kinds.get(region.kind, 0) + 1
            inside = {n for r in solutions[rel] for n in range(r.begin, r.end + 1)}
            public += [line for n, line in enumerate((source / rel).read_text().splitlines(), 1)
                       if n not in inside]
        else:
            shutil.copy2(source / rel, target)
            summary.copied += 1
            if rel == HANDOUT:
                handout = student_readme(_read_text(source / rel) or "", rel, shipped)
                target.write_text(handout, encoding="utf-8")
                public += handout.splitlines()
            if (re.match(r"task\d+/", rel) and Path(rel).suffix in PY_SUFFIXES | C_SUFFIXES
                    and Path(rel).name not in ("test.py", "compile.py", "__init__.py")):
                summary.unmarked.append(rel)
        kept.append(rel)
    from common.tools import report

    report.render(out / "Results.md", blank=True)
    kept.append("Results.md")
    findings = find_leaks(out, kept, solutions, public, allow)
    summary.notes = [f for f in findings if not f.fatal]
    fatal = [f for f in findings if f.fatal]
    if fatal:
        raise ReleaseError(
            f"the release in {out} leaks the solution ({len(fatal)} finding(s)); do not ship "
            "it:\n  " + "\n  ".join(map(str, fatal[:40]))
            + "\nRemove the text, drop the file (DROP in common/tools/release.py), or, if it is not a "
            "leak, pass --allow NAME.")
    return summary


def print_summary(summary: Summary) -> None:
    regions = sum(summary.rewritten.values())
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(summary.kinds.items())) or "none"
    print(f"[release] wrote {summary.out}")
    print(f"[release] {len(summary.rewritten)} solution files rewritten, {regions} regions "
          f"replaced ({kinds}):")
    for rel, n in sorted(summary.rewritten.items()):
        print(f"    {rel}: {n}")
    print(f"[release] {summary.copied} files copied as they are; Results.md reset to the blank "
          "template")
    if summary.dropped:
        print(f"[release] {len(summary.dropped)} files not shipped:")
        for rel, why in summary.dropped:
            print(f"    {rel}  ({why})")
    if summary.unmarked:
        print("[release] task code shipped exactly as written (no solution regions): "
              + ", ".join(summary.unmarked))
    for note in summary.notes:
        print(f"[release] note: {note}")
    print("[release] leak check: no solution code or solution-only name found in the output")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.release", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to write the student repository to")
    parser.add_argument("--force", action="store_true",
                        help="replace the contents of --out (a .git folder in it is kept)")
    parser.add_argument("--source", type=Path, default=REPO_ROOT,
                        help="the reference repository (default: this one)")
    parser.add_argument("--allow", action="append", default=[], metavar="NAME",
                        help="a name or line fragment the leak check must accept (repeatable)")
    args = parser.parse_args(argv)
    try:
        summary = release(args.out, args.source, force=args.force, allow=args.allow)
    except (MarkerError, ReleaseError) as err:
        print(f"[release] error: {err}")
        return 1
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
