"""What the peers' runners share: a Strata bench case (suite YAML + policy file), the results line
they append to DIR/peers.jsonl (the fields `strata bench` writes to results.jsonl, with "engine"
naming the peer), and the machine's description. Standard library only, so that the unit tests
run anywhere (PyYAML is used when installed; a small reader covers the YAML our suites use).
"""
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

# Strata's OPT presets (src/model/config.cpp): hidden, layers, heads; FFN 4 x hidden, vocabulary
# 50272, 2048 positions. The peers take these names from Hugging Face's facebook/ organisation.
OPT_PRESETS = {
    "opt-125m": (768, 12, 12),
    "opt-1.3b": (2048, 24, 32),
    "opt-6.7b": (4096, 32, 32),
    "opt-13b": (5120, 40, 40),
    "opt-30b": (7168, 48, 56),
    "opt-66b": (9216, 64, 72),
    "opt-175b": (12288, 96, 96),
}


class CaseError(Exception):
    """A case a peer cannot run as asked (an unknown model, a placement it cannot express)."""


# ---------------------------------------------------------------- a small YAML reader


def _scalar(text):
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("null", "~", ""):
        return None
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return t


def _flow_map(text):
    """{a: 1, b: x} (no nesting: what our suites and policies use)."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError("not a flow map: " + text)
    out = {}
    for item in filter(None, (p.strip() for p in body[1:-1].split(","))):
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError("no ':' in " + item)
        out[key.strip()] = _scalar(value)
    return out


def _strip_comment(line):
    # A '#' after whitespace (or at the start) opens a comment; ours never sit inside quotes.
    m = re.search(r"(^|\s)#", line)
    return line[: m.start()] if m else line


def read_yaml(text):
    """Parses the subset of YAML our suites and policies use: top-level `key: scalar`,
    `key: {flow map}`, and `key:` followed by `- {flow map}` items. PyYAML when installed."""
    try:
        import yaml  # type: ignore
    except ImportError:
        return read_yaml_subset(text)
    return yaml.safe_load(text)


def read_yaml_subset(text):
    """read_yaml without PyYAML."""
    out, current_list = {}, None
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if not line.strip():
            continue
        stripped = line.strip()
        if stripped.startswith("- "):
            if current_list is None:
                raise ValueError("list item outside a list: " + raw)
            item = stripped[2:].strip()
            current_list.append(_flow_map(item) if item.startswith("{") else _scalar(item))
            continue
        key, sep, value = stripped.partition(":")
        if not sep:
            raise ValueError("expected 'key: value': " + raw)
        value = value.strip()
        if value == "":
            current_list = out[key.strip()] = []
        elif value.startswith("{"):
            out[key.strip()] = _flow_map(value)
            current_list = None
        elif value == "[]":
            out[key.strip()] = []
            current_list = None
        else:
            out[key.strip()] = _scalar(value)
            current_list = None
    return out


# ---------------------------------------------------------------- cases and policies


@dataclass
class Policy:
    """Strata's policy (include/strata/policy/policy.h), as much as the peers need."""

    gpu_batch_size: int = 1
    num_gpu_batches: int = 1
    weights: dict = field(default_factory=lambda: {"gpu": 100, "cpu": 0, "disk": 0})
    kv_cache: dict = field(default_factory=lambda: {"gpu": 100, "cpu": 0, "disk": 0})
    activations: dict = field(default_factory=lambda: {"gpu": 100, "cpu": 0, "disk": 0})
    overlap: bool = True
    cpu_attention: bool = False
    compress_weights: Optional[dict] = None
    compress_kv_cache: Optional[dict] = None

    @property
    def block_size(self):
        return self.gpu_batch_size * self.num_gpu_batches


def policy_from_dict(d):
    p = Policy()
    for key in ("gpu_batch_size", "num_gpu_batches"):
        if key in d:
            setattr(p, key, int(d[key]))
    for key in ("weights", "kv_cache", "activations"):
        if key in d:
            split = {"gpu": 0, "cpu": 0, "disk": 0}
            split.update({k: int(v) for k, v in d[key].items()})
            setattr(p, key, split)
    for key in ("overlap", "cpu_attention"):
        if key in d:
            setattr(p, key, bool(d[key]))
    for key in ("compress_weights", "compress_kv_cache"):
        if d.get(key):
            setattr(p, key, dict(d[key]))
    return p


def load_policy(path):
    with open(path) as f:
        return policy_from_dict(read_yaml(f.read()))


@dataclass
class Case:
    """One case of a Strata bench suite (include/strata/job/bench.h, BenchCase)."""

    name: str
    model: str
    prompt_len: int
    gen_len: int
    policy: str = "auto"  # a file (relative to the suite's directory), or "auto"
    compress: bool = False
    gpu_mem: str = ""
    cpu_mem: str = ""
    disk_mem: str = ""
    suite_dir: str = "."

    def policy_path(self):
        return self.policy if os.path.isabs(self.policy) else os.path.join(self.suite_dir, self.policy)


def suite_path(file_or_name, repo_root=None):
    """A suite file, or the name of one in bench/suites/ (as `strata bench --suite` takes it)."""
    if os.path.exists(file_or_name):
        return file_or_name
    root = repo_root or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    path = os.path.join(root, "bench", "suites", file_or_name + ".yaml")
    if not os.path.exists(path):
        raise CaseError(f"suite '{file_or_name}': no such file, nor {path}")
    return path


def load_cases(file_or_name):
    path = suite_path(file_or_name)
    with open(path) as f:
        doc = read_yaml(f.read())
    cases = []
    for c in doc.get("cases") or []:
        cases.append(
            Case(
                name=str(c["name"]),
                model=str(c["model"]),
                prompt_len=int(c["prompt_len"]),
                gen_len=int(c["gen_len"]),
                policy=str(c.get("policy", "auto")),
                compress=bool(c.get("compress", False)),
                gpu_mem=str(c.get("gpu_mem") or ""),
                cpu_mem=str(c.get("cpu_mem") or ""),
                disk_mem=str(c.get("disk_mem") or ""),
                suite_dir=os.path.dirname(os.path.abspath(path)),
            )
        )
    return cases


_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30,
          "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text):
    """Bytes of '16GB', '15GiB', '512MB', '1000' (Strata's parse_size: GB is 1e9, GiB 2^30)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise CaseError(f"not a size: '{text}'")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def hf_model_name(model):
    """facebook/opt-6.7b for Strata's preset opt-6.7b (or dummy:opt-6.7b); CaseError otherwise."""
    name = model[len("dummy:"):] if model.startswith("dummy:") else model
    if name in OPT_PRESETS:
        return "facebook/" + name
    raise CaseError(f"model '{model}': the peers run Strata's OPT presets on dummy weights "
                    f"({', '.join(OPT_PRESETS)})")


def resolve_policy(case, strata=None, hardware=None):
    """The case's policy: its file, or with `auto` the one `strata policy` chooses under the case's
    caps (needs the strata binary and a hardware profile)."""
    if case.policy != "auto":
        return load_policy(case.policy_path()), None
    if not strata or not hardware:
        raise CaseError(f"case {case.name}: policy auto needs --strata BIN and --hardware HW.yaml")
    cmd = [strata, "policy", "--model", case.model, "--hardware", hardware, "--prompt-len", str(case.prompt_len),
           "--gen-len", str(case.gen_len), "--json"]
    for flag, value in (("--gpu-mem", case.gpu_mem), ("--cpu-mem", case.cpu_mem), ("--disk-mem", case.disk_mem)):
        if value:
            cmd += [flag, value]
    if case.compress:
        cmd.append("--compress")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return policy_from_dict(json.loads(out)["policy"]), shlex.join(cmd)


# ---------------------------------------------------------------- results lines


def measure(prompt_tokens, generated_tokens, sequences, prefill_s, decode_s):
    """FlexGen's definitions, as `strata bench` measures (src/job/bench.cpp, measure_of): prefill
    counts prompt tokens; decode the tokens after each sequence's first; total all generated tokens
    over both times."""
    m = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0, "total_tok_s": 0.0}
    if prefill_s > 0:
        m["prefill_tok_s"] = prompt_tokens / prefill_s
    if decode_s > 0:
        m["decode_tok_s"] = (generated_tokens - sequences) / decode_s
    if prefill_s + decode_s > 0:
        m["total_tok_s"] = generated_tokens / (prefill_s + decode_s)
    return m


def machine():
    """GPU name (nvidia-smi), CPU model and the Python environment."""
    gpu = "none"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            gpu = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"gpu": gpu, "cpu": cpu, "python": sys.version.split()[0]}


def result_line(case, engine, policy, status="ok", measured=None, command="", extra=None):
    """One peers.jsonl line: the fields of Strata's results.jsonl that a peer can fill."""
    line = {
        "name": case.name,
        "engine": engine,
        "model": case.model,
        "prompt_len": case.prompt_len,
        "gen_len": case.gen_len,
        "status": status,
        "gpu_batch_size": policy.gpu_batch_size if policy else None,
        "num_gpu_batches": policy.num_gpu_batches if policy else None,
        "caps": {"gpu_mem": case.gpu_mem, "cpu_mem": case.cpu_mem, "disk_mem": case.disk_mem},
        "command": command,
    }
    if measured is not None:
        line["measured"] = dict(measured, repeats=measured.get("repeats", 1))
    if extra:
        line.update(extra)
    return line


def append_line(out_dir, line):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "peers.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")
    return path


def select_cases(args):
    """The cases a runner's arguments name: --suite [--case NAME ...], or one case from --model etc."""
    if args.suite:
        cases = load_cases(args.suite)
        if args.case:
            names = set(args.case)
            cases = [c for c in cases if c.name in names]
            missing = names - {c.name for c in cases}
            if missing:
                raise CaseError(f"no case {', '.join(sorted(missing))} in suite {args.suite}")
        return cases
    if not (args.model and args.prompt_len and args.gen_len):
        raise CaseError("give --suite (and --case), or --model, --prompt-len, --gen-len and --policy")
    return [Case(name=args.name or f"{args.model}-{args.prompt_len}-{args.gen_len}", model=args.model,
                 prompt_len=args.prompt_len, gen_len=args.gen_len, policy=args.policy or "auto",
                 compress=args.compress, gpu_mem=args.gpu_mem or "", cpu_mem=args.cpu_mem or "",
                 disk_mem=args.disk_mem or "", suite_dir=os.getcwd())]


def add_case_arguments(parser):
    g = parser.add_argument_group("the case (a Strata bench suite's case, or its fields)")
    g.add_argument("--suite", help="suite YAML, or a name in bench/suites/ (smoke-cpu, paper-table2, h100)")
    g.add_argument("--case", action="append", help="a case of the suite (repeatable; default: all)")
    g.add_argument("--name", help="without --suite: the case's name in the results")
    g.add_argument("--model", help="without --suite: a Strata OPT preset (opt-6.7b, ...)")
    g.add_argument("--prompt-len", type=int)
    g.add_argument("--gen-len", type=int)
    g.add_argument("--policy", help="a Strata policy YAML, or auto")
    g.add_argument("--compress", action="store_true", help="with auto: 4-bit allowed")
    g.add_argument("--gpu-mem", help="GPU cap, e.g. 16GB")
    g.add_argument("--cpu-mem", help="CPU cap")
    g.add_argument("--disk-mem", help="disk cap")
    parser.add_argument("--strata", default="build/strata", help="strata binary (for policy auto)")
    parser.add_argument("--hardware", help="hardware profile YAML (for policy auto)")
    parser.add_argument("--out", default="bench-out", help="directory: the runner appends to OUT/peers.jsonl")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")


def run_cases(args, engine, run_case, failures=()):
    """Runs each selected case through `run_case(case, args)` and appends its line to args.out.
    A case the peer cannot express (CaseError) is recorded as unsupported; `failures` maps more
    exception types to a status text built from the exception."""
    for case in select_cases(args):
        try:
            line = run_case(case, args)
        except CaseError as e:
            line = result_line(case, engine, None, status=f"unsupported: {e}")
        except tuple(t for t, _ in failures) as e:
            status = next(text(e) for t, text in failures if isinstance(e, t))
            line = result_line(case, engine, None, status=status)
        if line is not None:
            print(f"[{engine}] {case.name}: {line['status']}", file=sys.stderr)
            append_line(args.out, line)
    return 0
