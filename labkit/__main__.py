"""Command line: python -m labkit doctor | sizes [--profile P] [--memory M] [--json] | student [--check] |
execute NB... | site [OUT] | bench NAME [--json] | gpu-check | release OUT [--labs 01,02] |
collect HOME... [--out returned] [--labs ...] [--exclude NAME...] [--roster FILE] |
grade SUBMISSIONS... [--labs ...] [--shard K/N] | grade merge PART.csv... [--out grades.csv]."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _student(args: argparse.Namespace) -> int:
    from labkit.course import student, views

    try:
        if args.check:
            problems = views.check(ROOT)
            for p in problems:
                print(f"labkit student --check: {p}", file=sys.stderr)
            if problems:
                if any("out of date" in p or "missing" in p for p in problems):
                    print("Regenerate with `make student` (python -m labkit student): it never overwrites a "
                          "notebook that holds answers.", file=sys.stderr)
                return 1
            print("labkit student --check: notebooks/, labkit/reference/ and labkit/labs/ are current")
            return 0
        for path in views.write(ROOT):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    except student.NotebookError as e:
        print(f"labkit student: {e}; nothing was written", file=sys.stderr)
        return 2


def _execute(args: argparse.Namespace) -> int:
    from labkit.course.notebook import execute

    for path in args.notebooks:
        seconds = execute(Path(path))
        print(f"executed {path} in {seconds:.1f} s")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from labkit.env.doctor import main

    return main()


def _sizes(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from labkit.env import sizing
    from labkit.env.profile import gpu_choice, profile, sizes

    try:
        name = args.profile or profile()
        if args.memory is not None and name != "gpu":
            raise ValueError(f"--memory sizes the gpu profile; profile {name!r} has fixed sizes")
        if name == "gpu":
            choice = sizing.choose(args.memory) if args.memory is not None else gpu_choice()
            figures = choice.as_json()
        else:
            size = sizes(name)
            figures = {"memory_bytes": None, "profile": name, "scale": 0, "sizes": asdict(size),
                       "labs": sizing.lab_peaks(size), "fraction": None, "note": f"the {name} profile's fixed sizes"}
    except ValueError as e:
        print(f"labkit sizes: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"profile {figures['profile']}: {figures['note']}")
    print("  " + ", ".join(f"{k}={v}" for k, v in figures["sizes"].items()))
    for lab, peak in figures["labs"].items():
        print(f"  lab {lab}: predicted peak {peak / 2**30:7.2f} GiB")
    return 0


def _site(args: argparse.Namespace) -> int:
    from labkit.course import site

    pages = site.build(ROOT / "solutions", Path(args.out))
    print(f"wrote {len(pages)} pages to {args.out}: open {Path(args.out) / 'index.html'}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from labkit.bench import main

    if args.name == "grade":  # the grader's own benchmark lives with the grader (course sits above bench)
        import json

        from labkit.course.grade.bench import grade_bench

        figures = grade_bench()
        print(json.dumps(figures) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
        return 0
    return main(args.name, as_json=args.json)


GPU_CHECK = ROOT / "tools" / "gpucheck.py"  # a maintainers' tool: in the kit's checkout, not in what students get


def _gpu_check(args: argparse.Namespace) -> int:
    """Become tools/gpucheck.py with the words given (the same process: its signals are the run's)."""
    if not GPU_CHECK.is_file():
        print("labkit gpu-check: a maintainers' tool of the kit's checkout (tools/gpucheck.py), not in this copy "
              "of the kit", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, str(GPU_CHECK), *args.rest])
    return 2  # not reached


def _release(args: argparse.Namespace) -> int:
    from labkit.course import release

    try:
        chosen = release.parse_labs(args.labs, release.labs(ROOT))
        notebooks = release.write(ROOT, Path(args.out), chosen)
    except release.ReleaseError as e:
        print(f"labkit release: {e}", file=sys.stderr)
        return 2
    print(f"wrote the student bundle of lab {', '.join(chosen)} to {args.out}: "
          f"{', '.join(p.name for p in notebooks)}; left out the reference answers "
          f"{', '.join(release.withheld(ROOT, chosen, bundle=True))}")
    if release.START not in chosen:
        print(f"labkit release: {release.CARRIED}")
    return 0


def _collect(args: argparse.Namespace) -> int:
    from labkit.course import collect, release

    try:
        labs = release.parse_labs(args.labs, release.labs(ROOT), in_order=False) if args.labs else None
        roster = collect.read_roster(Path(args.roster)) if args.roster else None
        found = collect.collect(args.homes, Path(args.out), labs, args.strip, args.exclude or [], roster)
    except (collect.CollectError, release.ReleaseError) as e:
        print(f"labkit collect: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the roster, or --out, cannot be read or written
        print(f"labkit collect: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    for line in found.left_out:
        print(f"labkit collect: left out {line}")
    for home in found.homes:
        print(f"labkit collect: {home.line()}")
    written = sum(len(h.written) for h in found.homes)
    empty = sum(not h.written for h in found.homes)
    print(f"labkit collect: {len(found.homes)} students in the class, {written} notebooks of "
          f"{len(found.homes) - empty} of them into {args.out}"
          + (f"; {empty} with nothing collected, each a `missing` row of the gradebook, with why (above, and in "
             f"{Path(args.out) / collect.CLASS_FILE})" if empty else "")
          + f": grade with `python -m labkit grade {args.out}`")
    return 0 if written else 1


# the options of `grade` that merge reads; it refuses the rest
MERGE_TAKES = ("submissions", "out", "points", "json", "key", "unsigned")


def _given(grading: argparse.ArgumentParser, words: list[str], dests: list[str]) -> dict:
    """The options of `grade` that `words` spell out (abbreviated or not), each with its value, defaults aside."""
    unset = object()  # argparse fills in a default only where the namespace has no value yet
    found = grading.parse_args(words, argparse.Namespace(**{d: unset for d in dests}))
    return {d: v for d, v in vars(found).items() if v is not unset}


def _merge(args: argparse.Namespace, given: dict) -> int:
    """`labkit grade merge PART.csv...`: the parts of a class graded with --shard K/N, joined into one gradebook."""
    from labkit.course.grade import report, shards, signature

    alone = [f"--{d.replace('_', '-')}" + ("" if v is True else f" {v}") for d, v in given.items()
             if d not in MERGE_TAKES]
    if alone:
        print(f"labkit grade merge: {', '.join(alone)}: for grading, not merging; merge grades nothing and takes what "
              "each part was graded as (labs, limits, profile, seed, K/N) from the parts; it takes PART.csv..., "
              "--out, --points, --json, --key and --unsigned", file=sys.stderr)
        return 2
    out, parts = Path(args.out), [Path(p) for p in args.submissions[1:]]
    try:
        shards.check_out(out, args.json, parts)
        points = report.read_points(Path(args.points) if args.points else None)
        merged = shards.merge(parts, signature.Key.at(Path(args.key) if args.key else None), args.unsigned)
        limits, rows = merged.limits, merged.rows
    except (OSError, ValueError) as e:
        print(f"labkit grade merge: {e}", file=sys.stderr)
        return 2
    try:
        book = report.write(rows, out, args.json, limits, points)
    except OSError as e:
        print(f"labkit grade merge: --out {out}: cannot be written ({e.strerror or e}: {e.filename or out})",
              file=sys.stderr)
        return 2
    if merged.unsigned:
        print(f"labkit grade merge: warning: {', '.join(merged.unsigned)} not signed, taken on their word "
              "(--unsigned): each was checked against itself, not against an edit that keeps it whole", file=sys.stderr)
    print(report.summary(rows, points))
    print(f"labkit grade merge: {len(parts)} parts, {len({r.student for r in rows})} students, "
          f"{len(rows)} rows written to {out}" + (f"; one row per student, with points and totals, to {book}"
                                                 if book != out else ""))
    return 0


def _race(args: argparse.Namespace, labs: list[str], shard: tuple[int, int] | None,
          limits: dict) -> tuple[dict | None, dict]:
    """(the leaderboard's race, prepared with the kit's reference planner, and where its results go); (None, {})
    without --leaderboard; ({}, {}) after saying why it cannot be run."""
    from labkit.course.grade import leaderboard

    if not args.leaderboard:
        return None, {}
    problem = (f"--leaderboard races lab {leaderboard.LAB}'s planners; --labs {','.join(labs)} leaves it out"
               if leaderboard.LAB not in labs else
               "--leaderboard ranks the whole class, so it runs in one run, not in a --shard" if shard else "")
    if problem:
        print(f"labkit grade: {problem}", file=sys.stderr)
        return {}, {}
    from labkit.labs.capstone import plan_for  # the kit's reference planner (the boxes never see it)

    race = leaderboard.prepare(plan_for, limits["profile"])
    print(f"labkit grade: leaderboard: each planner at budgets {', '.join(f'{b:,}' for b in race['budgets'])} B "
          f"(lab {leaderboard.LAB}'s model, profile {limits['profile']}), timed against the kit's planner")
    return race, {}


def _write_leaderboard(race: dict, raced: dict, rows: list, folder: Path) -> None:
    from labkit.course.grade import leaderboard

    leaderboard.fill(raced, rows)
    table = leaderboard.rows(race, raced)
    book, page = leaderboard.write(table, folder)
    ranked = sorted({r["student"] for r in table if r["rank"] != ""})
    print(f"labkit grade: leaderboard: {len(raced)} planners, {len(ranked)} ranked at some budget; written to "
          f"{book} and {page}")


def _signing_key(args: argparse.Namespace, shard: tuple[int, int] | None) -> signature.Key | None:
    """The key a part is signed with, made where there is none (said so); None for --unsigned. A ValueError for
    --key or --unsigned without --shard, or a key file that cannot be used."""
    from labkit.course.grade import shards, signature

    if shard is None:
        if args.key or args.unsigned:
            raise shards.ShardError("--key and --unsigned are for a part (--shard K/N) and for `grade merge`")
        return None
    key = None if args.unsigned else signature.Key.at(Path(args.key) if args.key else None, make=True)
    if key is not None and key.made:
        print(f"labkit grade: made the key {key.path} (mode 0600) that signs the parts: every part's job and "
              "`grade merge` must read this same key (--key FILE)", file=sys.stderr)
    return key


def _grade(args: argparse.Namespace) -> int:
    import secrets

    from labkit.course import release
    from labkit.course.grade import grader as grade, report, sandbox, shards, signature

    try:
        labs = release.parse_labs(args.labs, release.labs(ROOT), in_order=False)
        shard = shards.parse(args.shard) if args.shard is not None else None
    except (release.ReleaseError, shards.ShardError) as e:
        print(f"labkit grade: {e}", file=sys.stderr)
        return 2
    for name, value in (("--timeout", args.timeout), ("--notebook-timeout", args.notebook_timeout),
                        ("--memory", args.memory), ("--jobs", args.jobs)):
        if value is not None and value <= 0:
            print(f"labkit grade: {name} {value}: must be positive", file=sys.stderr)
            return 2
    given = {"cell_timeout": args.timeout, "notebook_timeout": args.notebook_timeout, "memory_gib": args.memory,
             "profile": args.profile}
    limits = dict(grade.LIMITS, **{k: v for k, v in given.items() if v is not None})
    try:
        points = report.read_points(Path(args.points) if args.points else None)
    except (OSError, ValueError) as e:
        print(f"labkit grade: --points: {e}", file=sys.stderr)
        return 2
    if args.leaderboard and ("07" not in labs or shard is not None):
        return _race(args, labs, shard, {})[0] or 2  # says why, before any box is made
    if shard is not None and args.seed is None:  # parts drawn from other seeds are other runs: merge refuses them
        print("labkit grade: --shard needs --seed N, the same N for every part (the hidden cases are drawn from it)",
              file=sys.stderr)
        return 2
    try:
        key = _signing_key(args, shard)
    except ValueError as e:
        print(f"labkit grade: {e}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    limits["seed"] = seed
    out = Path(args.out).resolve()
    sandboxed = f"bubblewrap, network off, as {sandbox.identity()}" if not args.no_sandbox else "NONE (--no-sandbox)"
    print(f"labkit grade: limits: exercise {limits['cell_timeout']:g} s, notebook {limits['notebook_timeout']:g} s, "
          f"memory {limits['memory_gib']:g} GiB, {limits['processes']} processes and "
          f"{max(1, (os.cpu_count() or 1) // args.jobs)} CPU a box (kept by "
          f"{sandbox.kept_by() if not args.no_sandbox else 'a watch from outside (polled)'}), /tmp and /dev/shm "
          f"{sandbox.TMP_BYTES // 2**20} MiB each, profile {args.profile}, {args.jobs} at a time; sandbox: "
          f"{sandboxed}; hidden cases from seed {seed}")
    out.parent.mkdir(parents=True, exist_ok=True)  # made now, so the sandbox covers it with a decoy
    hidden = [ROOT, out.parent, Path.home()] + ([key.path] if key is not None else [])  # the key: never in a box
    race, raced = _race(args, labs, shard, limits)
    if race == {}:
        return 2
    roster: list[str] = []  # the whole class's names, as this machine found them: the part's facts carry them
    try:
        rows = grade.grade(ROOT, [Path(p).absolute() for p in args.submissions], labs, limits, args.jobs, hidden,
                           use_sandbox=not args.no_sandbox,
                           executed=Path(args.executed).resolve() if args.executed else None, seed=seed, shard=shard,
                           race=race, raced=raced, roster=roster)
    except grade.GradeError as e:
        print(f"labkit grade: {e}", file=sys.stderr)
        return 2
    if race is not None:
        _write_leaderboard(race, raced, rows, out.parent)
    unknown = sorted(set(points) - {r.exercise for r in rows})
    if unknown and shard is None:  # a part may hold no student of an exercise the table names
        print(f"labkit grade: --points names {', '.join(unknown)}, not an exercise graded here; those points count "
              "for nothing (each graded exercise it does not name is worth 1)", file=sys.stderr)
    part = shards.facts(labs, limits, *shard, roster=roster, exercises=shards.exercises_of(ROOT, labs)) \
        if shard is not None else None
    if part is not None:
        print(f"labkit grade: part {shard[0]}/{shard[1]} of the class ({len({r.student for r in rows})} students); "
              f"join the parts with `python -m labkit grade merge PART.csv...`")
    book = report.write(rows, out, args.json, limits, points, part)
    if key is not None:
        signature.sign_files(out, args.json, key)
    print(report.summary(rows, points))
    print(f"labkit grade: {len(rows)} rows written to {args.out}" +
          (f"; one row per student, with points and totals, to {book}" if book != out else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check this environment; exit 1 if something is broken").set_defaults(run=_doctor)
    p = sub.add_parser("sizes", help="the sizes a profile uses and each lab's predicted peak memory")
    p.add_argument("--profile", choices=("tiny", "cpu", "gpu"), help="default: the active profile")
    p.add_argument("--memory", help="gpu: size for this much free memory (16GiB, 24GB, ...) instead of this GPU's")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_sizes)
    p = sub.add_parser("student", help="regenerate notebooks/, labkit/reference/ and labkit/labs/ from solutions/")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything is out of date")
    p.set_defaults(run=_student)
    p = sub.add_parser("execute", help="execute notebooks in place (outputs kept)")
    p.add_argument("notebooks", nargs="+")
    p.set_defaults(run=_execute)
    p = sub.add_parser("site", help="the executed solutions as a static reading site (index.html first)")
    p.add_argument("out", nargs="?", default="site", help="folder to write (default site/)")
    p.set_defaults(run=_site)
    p = sub.add_parser("bench", help="run one benchmark and print its figures")
    p.add_argument("name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_bench)
    p = sub.add_parser("gpu-check", add_help=False,
                       help="maintainers, on a GPU: GPU-only tests, benchmarks and every lab, each row in its own "
                            "process; a JSON line per row under docs/gpu/, table last (tools/gpucheck.py; --help)")
    p.set_defaults(run=_gpu_check, passes_on=True)  # every word after it is tools/gpucheck.py's
    p = sub.add_parser("release", help="write the student bundle of some labs, without their reference answers")
    p.add_argument("out", help="a new (or empty) folder")
    p.add_argument("--labs", help="comma-separated lab numbers, in order, none skipped (default: all)")
    p.set_defaults(run=_release)
    p = sub.add_parser("collect", help="copy the students' lab notebooks from their homes into OUT/<name>/, "
                                       "never following a link out of a home; the class is kept for grade")
    p.add_argument("homes", nargs="+", help="the students' home folders: /home/* as the shell expands it, or a "
                                            "quoted pattern '/home/*' (each folder's name is the student's; your "
                                            "own home, $HOME, is left out)")
    p.add_argument("--out", default="returned", help="a new folder to fill (default returned/), as grade reads it: "
                                                     "outside every student's home (your own home will do)")
    p.add_argument("--labs", help="comma-separated lab numbers to collect (default: all)")
    p.add_argument("--strip", default="", help="a prefix of the home folders' names to drop (jupyter- on The "
                                               "Littlest JupyterHub)")
    p.add_argument("--exclude", nargs="+", action="extend", metavar="NAME",
                   help="homes that are no student's (teaching assistants), by folder or student name")
    p.add_argument("--roster", metavar="FILE", help="the class, one student's name a line: a name without a home "
                                                    "is a missing row of the gradebook, a home not on it left out")
    p.set_defaults(run=_collect)
    p = sub.add_parser("grade", help="grade returned notebooks, each rebuilt from the pristine one, in a sandbox")
    p.add_argument("submissions", nargs="+", help="notebooks, or folders searched for them (collect's --out: every "
                                                  "student of its class a row); or `merge PART.csv...`: "
                                                  "join the parts graded with --shard into one gradebook (--out)")
    p.add_argument("--labs", help="comma-separated lab numbers to grade (default: all)")
    p.add_argument("--out", default="grades.csv", help="the gradebook (default grades.csv; one row per student, "
                                                         "with points and totals, beside it: grades_students.csv)")
    p.add_argument("--points", help="a CSV of `exercise,points` lines (default: 1 point per exercise)")
    p.add_argument("--json", action="store_true", help="write JSON (limits and rows) instead of CSV")
    p.add_argument("--timeout", type=float, help="seconds per exercise (default 60, sized for the tiny profile)")
    p.add_argument("--notebook-timeout", type=float, help="seconds per notebook (default 300)")
    p.add_argument("--memory", type=float, help="GiB of memory for each submission's box, all its processes together (default 4)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="submissions at a time (default: cores)")
    p.add_argument("--profile", default="tiny", choices=("tiny", "cpu"),
                   help="LABKIT_PROFILE the boxes run (default tiny; the sandbox has no GPU)")
    p.add_argument("--executed", help="a folder to keep what was run for each submission in (JSON)")
    p.add_argument("--seed", type=int, help="the seed of the hidden cases (default: drawn afresh, printed)")
    p.add_argument("--no-sandbox", action="store_true", help="no bubblewrap: only for notebooks you trust")
    p.add_argument("--shard", metavar="K/N", help="grade only part K of N (K from 0), chosen by a hash of each "
                                                  "student's name; `grade merge PART.csv...` joins the parts")
    p.add_argument("--key", metavar="FILE", help="--shard signs its part with this key, and merge checks each part's "
                                                 "signature with it (default ~/.config/labkit/grade.key, made by "
                                                 "--shard where there is none)")
    p.add_argument("--unsigned", action="store_true", help="--shard: write the part unsigned; merge: take unsigned "
                                                           "parts, saying so (refused without it)")
    p.add_argument("--leaderboard", action="store_true", help="lab 07: race each student's planner against the "
                                                              "kit's at the lab's budgets; leaderboard.csv and .html "
                                                              "beside --out")
    p.set_defaults(run=_grade)
    words = list(sys.argv[1:] if argv is None else argv)
    args, args.rest = parser.parse_known_args(words)
    if args.rest and not getattr(args, "passes_on", False):
        parser.error(f"unrecognized arguments: {' '.join(args.rest)}")
    if args.command == "grade" and args.submissions[0] == "merge":  # a folder of that name is ./merge
        return _merge(args, _given(sub.choices["grade"], words[1:], list(vars(args))))
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
