#!/usr/bin/python3
"""The chaos test (docs/reliability.md, "Chaos test"): a 4-rank run (PP 2 x DP 2, ZeRO-1, a
checkpoint after every step) is killed again and again, one random rank with SIGKILL at a
seeded random moment, and relaunched with --resume auto until it completes. A kill lands

  random  at a random time after the launch,
  write   while a checkpoint's temp file is being written,
  commit  inside the commit: right after the temp file's rename, or while latest.tmp exists
          (TRIDENT_TEST_COMMIT_PAUSE_MS widens both windows).

After every kill: `latest` names a committed checkpoint (never a temp file) that exists, it
never goes back to an earlier step, and every committed checkpoint passes
`trident ckpt info --verify`. When the run completes its final checkpoint must equal an
uninterrupted run's bit for bit (ckpt_compare: every tensor, elements counted); if kills are
left, another round starts in a fresh checkpoint directory.

  test_chaos.py --trident BIN --mpiexec MPIEXEC --compare CKPT_COMPARE [--kills 10]
                [--seed S] [--ranks 4|8] [--steps 12] [--modes commit,random,write]
                [--async] [--keep]
--async saves with checkpoint.async = true: the writes a kill lands in run in each rank's
writer thread while training goes on (the final save is synchronous).
TRIDENT_CHAOS_KILLS=N overrides --kills (50 or more for a long run). Exit 0: passed.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_runs  # noqa: E402

# The layouts by rank count: PP 2 x DP 2 (ZeRO-1), or TP 2 x PP 2 x DP 2 (ZeRO-1).
LAYOUTS = {4: "[parallel]\npipeline = 2\ndata = 2\n",
           8: "[parallel]\ntensor = 2\npipeline = 2\ndata = 2\n"}
CHECKPOINT_NAME = re.compile(r"^step_\d{8,}\.h5$")
# Slows each dataset write and each commit step, so that kills land inside them often.
CHAOS_ENV = {"TRIDENT_TEST_SLOW_CHECKPOINT_MS": "1", "TRIDENT_TEST_COMMIT_PAUSE_MS": "40"}


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def train_command(args, config, ckpt_dir, log_dir):
    return [args.mpiexec, "-n", str(args.ranks), args.trident, "train", "--config", config,
            "--set", "checkpoint.dir=" + ckpt_dir, "--set", "log.dir=" + log_dir,
            "--resume", "auto"]


def descendants(root):
    """Pids of every process below `root` (from /proc), with their command names."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'.
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append((int(entry), comm))
    out, todo = [], [root]
    while todo:
        for pid, comm in children.get(todo.pop(), []):
            out.append((pid, comm))
            todo.append(pid)
    return out


def ranks_of(job):
    return sorted(pid for pid, comm in descendants(job.pid) if comm == "trident")


def temp_files(ckpt_dir):
    try:
        return [n for n in os.listdir(ckpt_dir) if ".h5.tmp-" in n]
    except FileNotFoundError:
        return []


def wait_for(job, condition, limit_s):
    """Polls `condition` every 2 ms until true (returns True), the job ended or limit_s passed."""
    until = time.monotonic() + limit_s
    while time.monotonic() < until and job.poll() is None:
        if condition():
            return True
        time.sleep(0.002)
    return False


def kill_moment(job, mode, rng, ckpt_dir, reference_s):
    """Waits for the moment `mode` asks for; False if the job ended first."""
    if mode == "random":
        wait_for(job, lambda: False, rng.uniform(0.2, 0.5 * reference_s))
        return job.poll() is None
    if mode == "write":
        # The first, second or third write of this launch (later ones with committed
        # checkpoints before them).
        seen, wanted = set(), rng.randint(1, 3)

        def nth_write_started():
            seen.update(temp_files(ckpt_dir))
            return len(seen) >= wanted
        if not wait_for(job, nth_write_started, 4 * reference_s):
            return False
        time.sleep(rng.uniform(0, 0.1))  # somewhere inside the write
        return job.poll() is None
    # commit: after the rename (the temp file gone, `latest` not updated yet), or at latest.tmp
    if rng.random() < 0.5:
        if not wait_for(job, lambda: temp_files(ckpt_dir), 4 * reference_s):
            return False
        return wait_for(job, lambda: not temp_files(ckpt_dir), 4 * reference_s)
    return wait_for(job, lambda: os.path.exists(os.path.join(ckpt_dir, "latest.tmp")),
                    4 * reference_s)


def committed(ckpt_dir):
    return sorted(n for n in os.listdir(ckpt_dir) if CHECKPOINT_NAME.match(n)) \
        if os.path.isdir(ckpt_dir) else []


def check_directory(args, ckpt_dir, last_latest_step, verified):
    """The invariants after a kill; returns the step `latest` names (-1: none yet)."""
    names = committed(ckpt_dir)
    latest_path = os.path.join(ckpt_dir, "latest")
    step = -1
    if os.path.exists(latest_path):
        with open(latest_path) as f:
            content = f.read()
        if not content.endswith("\n") or not CHECKPOINT_NAME.match(content.strip()):
            fail("`latest` holds %r, not a committed checkpoint's name" % content)
        if content.strip() not in names:
            fail("`latest` names %s, which does not exist" % content.strip())
        step = int(content.strip()[5:-3])
    if step < last_latest_step:
        fail("`latest` went back from step %d to %d: a committed checkpoint was lost"
             % (last_latest_step, step))
    for name in names:
        r = subprocess.run([args.trident, "ckpt", "info", "--verify",
                            os.path.join(ckpt_dir, name)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            fail("committed checkpoint %s does not verify:\n%s%s" % (name, r.stdout, r.stderr))
        verified[0] += 1
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--compare", required=True)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ranks", type=int, choices=sorted(LAYOUTS), default=4)
    ap.add_argument("--steps", type=int, default=12, help="a checkpoint after each")
    ap.add_argument("--modes", default="commit,random,write",
                    help="the kinds of kill moments to draw from (comma-separated)")
    ap.add_argument("--async", dest="async_saves", action="store_true",
                    help="checkpoint.async = true (the uninterrupted run too)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    kills = int(os.environ.get("TRIDENT_CHAOS_KILLS", args.kills))
    rng = random.Random(args.seed)

    work = tempfile.mkdtemp(prefix="trident_chaos_")
    tiny_runs.make_corpus(work)
    config = os.path.join(work, "config.toml")
    text = tiny_runs.tiny_config(work, os.path.join(work, "log"), extra=(
        LAYOUTS[args.ranks] + "[checkpoint]\ninterval = 1\nkeep = 3\n" +
        ("async = true\n" if args.async_saves else "")))
    for before, after in (("steps = 6", "steps = %d" % args.steps),
                          ("warmup_steps = 2\n", "warmup_steps = 2\nzero_stage = 1\n"),
                          ("[eval]\ninterval = 3", "[eval]\ninterval = 0")):
        if before not in text:
            fail("tiny_runs.tiny_config has no %r any more" % before)
        text = text.replace(before, after)
    with open(config, "w") as f:
        f.write(text)
    env = dict(os.environ, **CHAOS_ENV)

    # The uninterrupted run (same environment: the slowdowns change no number).
    started = time.monotonic()
    ref_dir = os.path.join(work, "reference")
    r = subprocess.run(train_command(args, config, ref_dir, os.path.join(work, "ref_log")),
                       capture_output=True, text=True, timeout=300, env=env)
    reference_s = time.monotonic() - started
    if r.returncode != 0:
        fail("the uninterrupted run exited %d\n%s%s" % (r.returncode, r.stdout, r.stderr))

    ckpt_dir = os.path.join(work, "chaos")
    final = "step_%08d.h5" % args.steps
    modes = {m: 0 for m in args.modes.split(",")}
    launches, done, rounds, latest_step, verified = 0, 0, 0, -1, [0]
    # A round: launches until the run completes. Kills left when it completes: another round
    # in a fresh directory, so that every kill asked for happens.
    while done < kills or rounds == 0:
        rounds += 1
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        latest_step = -1
        finished = False
        while not finished:
            launches += 1
            if launches > 2 * kills + 20:
                fail("no completion after %d launches" % launches)
            job = subprocess.Popen(
                train_command(args, config, ckpt_dir, os.path.join(work, "log")),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                start_new_session=True)
            killed = False
            if done < kills:
                mode = rng.choice(sorted(modes))
                if kill_moment(job, mode, rng, ckpt_dir, reference_s):
                    ranks = ranks_of(job)
                    if ranks:
                        try:
                            os.kill(ranks[rng.randrange(len(ranks))], signal.SIGKILL)
                            killed = True
                            done += 1
                            modes[mode] += 1
                        except ProcessLookupError:
                            pass
            try:
                output, _ = job.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.communicate()
                fail("launch %d did not end within 300 s (a hang after a kill?)" % launches)
            code = job.returncode
            if code == 0:
                finished = True
            elif not killed:
                fail("launch %d exited %d without a kill:\n%s" % (launches, code, output))
            latest_step = check_directory(args, ckpt_dir, latest_step, verified)
            print("round %d launch %d: %s, exit %d, latest step %d"
                  % (rounds, launches, "killed a rank" if killed else "no kill", code,
                     latest_step), flush=True)
        r = subprocess.run([args.compare, os.path.join(ref_dir, final),
                            os.path.join(ckpt_dir, final)],
                           capture_output=True, text=True, timeout=120)
        print("round %d: final checkpoint vs uninterrupted run: %s" % (rounds, r.stdout.strip()))
        if r.returncode != 0:
            fail("the final checkpoint differs from the uninterrupted run's\n" + r.stderr)
    print("chaos: %d kills (%s) in %d launches and %d rounds, %d checkpoint verifications, "
          "seed %d; passed" % (done, ", ".join("%s %d" % kv for kv in sorted(modes.items())),
                               launches, rounds, verified[0], args.seed))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
