#!/usr/bin/python3
"""Expand a sweep file into the tasks of one Slurm job array (jobscripts/sweep.sh runs it).

Usage:
  /usr/bin/python3 data_tools/sweep.py SWEEP.toml --out-dir DIR

A sweep file (TOML):

    name = "lr_seed"                        # the job name; runs are DIR/<run name>
    configs = ["../configs/exp/tiny_lr_high.toml"]   # base config(s), layered in order;
                                            # relative to the sweep file
    pattern = "lr{optim.lr}-seed{train.seed}"   # run name; {section.key} is the value
    set = ["train.steps=200"]               # optional: --set for every run

    [grid]                                  # every combination (cartesian product) ...
    "optim.lr" = [1e-3, 3e-3]
    "train.seed" = [1, 2]

    # ... and/or listed combinations, each its own table:
    [[runs]]
    "optim.lr" = 1e-2
    "train.seed" = 7

Writes DIR/tasks.tsv (one line per array task, in task order: NAME, RUN_DIR, the configs
joined by ':', then the --set arguments tab-separated) and DIR/manifest.tsv (one line per
task: TASK<TAB>NAME<TAB>OVERRIDES<TAB>RUN_DIR, OVERRIDES being the run's own swept
section.key=value settings, space-separated; the input of data_tools/compare_runs.py
--manifest, which takes the last field), and prints "NAME TASKS". Bad
input (a missing key, a key that is no section.key, an empty grid, two runs with the same
name, a value with whitespace or a tab) is one line on stderr naming the file, exit code 1.
"""
import argparse
import itertools
import os
import re
import sys
import tomllib

KEY = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
NAME = re.compile(r"^[A-Za-z0-9._+-]+$")


class SweepError(Exception):
    pass


def toml_value_text(value):
    """A value as `--set section.key=` takes it (a TOML value, or a string's own text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ",".join(toml_value_text(v) if not isinstance(v, str) else
                              '"%s"' % v for v in value) + "]"
    raise SweepError("unsupported value %r" % (value,))


def check_keys(table, where):
    for key in table:
        if not KEY.match(key):
            raise SweepError(f"{where}: '{key}' is not section.key")


def combinations(doc, path):
    combos = []
    grid = doc.get("grid", {})
    if not isinstance(grid, dict):
        raise SweepError(f"{path}: grid must be a table of section.key = [values]")
    if grid:
        check_keys(grid, path + ": grid")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise SweepError(f"{path}: grid.\"{key}\" must be a non-empty array of values")
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            combos.append(dict(zip(keys, values)))
    runs = doc.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise SweepError(f"{path}: runs must be an array of tables ([[runs]])")
    for i, run in enumerate(runs):
        check_keys(run, f"{path}: runs[{i}]")
        combos.append(dict(run))
    if not combos:
        raise SweepError(f"{path}: no runs: give [grid] and/or [[runs]]")
    return combos


def run_name(pattern, combo, path):
    def value(match):
        key = match.group(1)
        if key not in combo:
            raise SweepError(f"{path}: pattern names {{{key}}}, which this run does not set")
        return toml_value_text(combo[key])
    name = re.sub(r"\{([^}]*)\}", value, pattern)
    if not NAME.match(name):
        raise SweepError(f"{path}: run name '{name}' (pattern '{pattern}') may only have "
                         "letters, digits and . _ + -")
    return name


def expand(path, out_dir):
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise SweepError(f"{path}: cannot read: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"{path}: not TOML: {e}")
    known = {"name", "configs", "pattern", "set", "grid", "runs"}
    for key in doc:
        if key not in known:
            raise SweepError(f"{path}: unknown key '{key}' (known: {', '.join(sorted(known))})")
    for key in ("name", "configs", "pattern"):
        if key not in doc:
            raise SweepError(f"{path}: '{key}' is missing")
    if not isinstance(doc["name"], str) or not NAME.match(doc["name"]):
        raise SweepError(f"{path}: name must be letters, digits and . _ + -")
    configs = doc["configs"]
    if isinstance(configs, str):
        configs = [configs]
    if not configs or not all(isinstance(c, str) and c for c in configs):
        raise SweepError(f"{path}: configs must be a config file or an array of them")
    base = os.path.dirname(os.path.abspath(path))
    configs = [os.path.normpath(os.path.join(base, c)) for c in configs]
    for c in configs:
        if not os.path.isfile(c):
            raise SweepError(f"{path}: config {c}: no such file")
    common = doc.get("set", [])
    if not isinstance(common, list) or not all(isinstance(s, str) and "=" in s for s in common):
        raise SweepError(f"{path}: set must be an array of \"section.key=value\" strings")

    tasks, names = [], set()
    for combo in combinations(doc, path):
        name = run_name(doc["pattern"], combo, path)
        if name in names:
            raise SweepError(f"{path}: two runs are named '{name}': the pattern must tell "
                             "every combination apart")
        names.add(name)
        sets = list(common) + [f"{k}={toml_value_text(v)}" for k, v in combo.items()]
        for s in sets:
            if re.search(r"\s", s):
                raise SweepError(f"{path}: '{s}': values with whitespace are not supported")
        own = [f"{k}={toml_value_text(v)}" for k, v in combo.items()]
        tasks.append((name, os.path.join(out_dir, name), configs, sets, own))

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tasks.tsv"), "w") as f:
        for name, run_dir, cfgs, sets, _ in tasks:
            f.write("\t".join([name, run_dir, ":".join(cfgs)] + sets) + "\n")
    with open(os.path.join(out_dir, "manifest.tsv"), "w") as f:
        f.write("# task\tname\toverrides\trun_dir (sweep %s, %s)\n"
                % (doc["name"], os.path.abspath(path)))
        for task, (name, run_dir, _, _, own) in enumerate(tasks):
            f.write(f"{task}\t{name}\t{' '.join(own)}\t{run_dir}\n")
    return doc["name"], len(tasks)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    try:
        name, n = expand(args.sweep, os.path.abspath(args.out_dir))
    except SweepError as e:
        print(f"sweep.py: error: {e}", file=sys.stderr)
        return 1
    print(name, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
