"""`grade` and `grade merge`: a class graded (whole, or one part of it), and the parts joined into one gradebook.

`grade` parses into grading's Options (labkit/course/grade/options.py), calls `grader.run`, and writes what it gets
back; `grade merge PART...` is a command of its own, with its own options, which grades nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MERGE = "python -m labkit grade merge"


def add(commands: argparse._SubParsersAction) -> None:
    """The group's commands: `grade` (and, in its help, `grade merge`, parsed by merge_parser)."""
    p = commands.add_parser("grade", help="grade returned notebooks, each rebuilt from the pristine one, in a "
                                          "sandbox; `grade merge PART...` joins a class graded in parts")
    options(p)
    p.set_defaults(run=grade)


def options(p: argparse.ArgumentParser) -> None:
    """`grade`'s arguments."""
    p.add_argument("submissions", nargs="+", help="notebooks, or folders searched for them (collect's --out: every "
                                                  "student of its class a row); `grade merge PART...` (its own "
                                                  "--help) joins the parts graded with --shard into one gradebook")
    p.add_argument("--labs", help="comma-separated lab numbers to grade (default: all)")
    p.add_argument("--out", default="grades.csv", help="the gradebook (default grades.csv; one row per student, "
                                                         "with points and totals, beside it: grades_students.csv)")
    p.add_argument("--points", help="a CSV of `exercise,points` lines (default: 1 point per exercise)")
    p.add_argument("--json", action="store_true", help="write JSON (limits and rows) instead of CSV")
    p.add_argument("--timeout", type=float, help="seconds per exercise (default 60, sized for the tiny profile)")
    p.add_argument("--notebook-timeout", type=float, help="seconds per notebook (default 300)")
    p.add_argument("--memory", type=float, help="GiB of memory for each submission's box, all its processes "
                                                "together (default 4)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="submissions at a time (default: cores)")
    p.add_argument("--profile", default="tiny", choices=("tiny", "cpu"),
                   help="the profile the boxes run (default tiny; the sandbox has no GPU)")
    p.add_argument("--executed", help="a folder to keep what was run for each submission in (JSON)")
    p.add_argument("--seed", type=int, help="the seed of the hidden cases (default: drawn afresh, printed)")
    p.add_argument("--no-sandbox", action="store_true", help="no bubblewrap: only for notebooks you trust")
    p.add_argument("--shard", metavar="K/N", help="grade only part K of N (K from 0), chosen by a hash of each "
                                                  "student's name; `grade merge PART...` joins the parts")
    p.add_argument("--key", metavar="FILE", help="--shard signs its part with this key (default "
                                                 "~/.config/labkit/grade.key, made where there is none)")
    p.add_argument("--unsigned", action="store_true", help="--shard: write the part unsigned")
    p.add_argument("--leaderboard", action="store_true", help="lab 07: race each student's planner against the "
                                                              "kit's at the lab's budgets; leaderboard.csv and .html "
                                                              "beside --out")


@dataclass
class _Run:
    """What `grade` was asked, parsed and checked: the run's options and what is done with its gradebook."""

    options: Any  # labkit.course.grade.options.Options
    out: Path  # the gradebook
    as_json: bool  # written as JSON, not CSV
    points: dict[str, float]  # exercise -> its points (--points)
    key: Any  # labkit.course.grade.signature.Key, or None (no part, or --unsigned)


def grade(args: argparse.Namespace) -> int:
    """Grade the class; write the gradebook (a signed part with --shard) and, with --leaderboard, the leaderboard."""
    from labkit.course.grade import grader

    try:
        run = _parsed(args)  # every refusal that needs nothing made comes first
        _announce(run.options, args.jobs)
        run = _prepared(run, args)
        book = grader.run(run.options)
    except ValueError as e:  # GradeError, a refused option, a key or points that cannot be used
        print(f"labkit grade: {e}", file=sys.stderr)
        return 2
    if run.options.race is not None:
        _write_leaderboard(run.options.race, book, run.out.parent)
    _write(run, book)
    return 0


def _parsed(args: argparse.Namespace) -> _Run:
    """The run `args` ask for, checked, nothing made yet (no key, no folder, no race); a ValueError names what
    cannot be."""
    import secrets

    from labkit.course import release
    from labkit.course.grade import report, shards
    from labkit.course.grade.options import Limits, Options

    if "merge" in args.submissions and not os.path.lexists("merge"):  # `grade --labs 02 merge ...`: a typo
        raise ValueError(f"'merge' is no submission here; to join parts, merge comes right after grade: {MERGE} "
                         "PART... [--out grades.csv]")
    labs = release.parse_labs(args.labs, release.labs(ROOT), in_order=False)
    shard = shards.parse(args.shard) if args.shard is not None else None
    if args.leaderboard:
        _can_race(labs, shard)
    if shard is not None and args.seed is None:  # parts drawn from other seeds are other runs: merge refuses them
        raise ValueError("--shard needs --seed N, the same N for every part (the hidden cases are drawn from it)")
    given = {"cell_timeout": args.timeout, "notebook_timeout": args.notebook_timeout, "memory_gib": args.memory}
    limits = Limits(**{k: v for k, v in given.items() if v is not None}, profile=args.profile,
                    seed=args.seed if args.seed is not None else secrets.randbelow(2**31))
    try:
        points = report.read_points(Path(args.points) if args.points else None)
    except (OSError, ValueError) as e:
        raise ValueError(f"--points: {e}") from None
    options = Options(tuple(Path(p).absolute() for p in args.submissions), tuple(labs), limits, args.jobs, (),
                      not args.no_sandbox, Path(args.executed).resolve() if args.executed else None, shard)
    return _Run(options, Path(args.out).resolve(), args.json, points, None)


def _prepared(run: _Run, args: argparse.Namespace) -> _Run:
    """`run` ready to go: the part's key (made where there is none), the gradebook's folder, what every box covers
    and, with --leaderboard, the race."""
    import dataclasses

    key = _signing_key(args, run.options.shard)
    run.out.parent.mkdir(parents=True, exist_ok=True)  # made now, so the sandbox covers it with a decoy
    hidden = (ROOT, run.out.parent, Path.home(), *([key.path] if key is not None else []))  # the key: never in a box
    race = _race(run.options.limits) if args.leaderboard else None
    return dataclasses.replace(run, options=dataclasses.replace(run.options, hidden=hidden, race=race), key=key)


def _signing_key(args: argparse.Namespace, shard: tuple[int, int] | None) -> Any:
    """The key a part is signed with, made where there is none (said so); None without a part or with --unsigned."""
    from labkit.course.grade import signature

    if shard is None:
        if args.key or args.unsigned:
            raise ValueError("--key and --unsigned are for a part (--shard K/N) and for `grade merge`")
        return None
    key = None if args.unsigned else signature.Key.at(Path(args.key) if args.key else None, make=True)
    if key is not None and key.made:
        print(f"labkit grade: made the key {key.path} (mode 0600) that signs the parts: every part's job and "
              "`grade merge` must read this same key (--key FILE)", file=sys.stderr)
    return key


def _can_race(labs: list[str], shard: tuple[int, int] | None) -> None:
    """A ValueError saying why this run cannot race lab 07's planners, if it cannot."""
    from labkit.course.grade import leaderboard

    if leaderboard.LAB not in labs:
        raise ValueError(f"--leaderboard races lab {leaderboard.LAB}'s planners; --labs {','.join(labs)} leaves it out")
    if shard is not None:
        raise ValueError("--leaderboard ranks the whole class, so it runs in one run, not in a --shard")


def _race(limits: Any) -> dict:
    """The leaderboard's race, prepared with the kit's reference planner (the boxes never see it)."""
    from labkit.course.grade import leaderboard
    from labkit.labs.capstone import plan_for  # the surface may import the answers; grading never does

    race = leaderboard.prepare(plan_for, limits.profile)
    print(f"labkit grade: leaderboard: each planner at budgets {', '.join(f'{b:,}' for b in race['budgets'])} B "
          f"(lab {leaderboard.LAB}'s model, profile {limits.profile}), timed against the kit's planner")
    return race


def _announce(options: Any, jobs: int) -> None:
    """The limits line, printed before the first box is made."""
    from labkit.course.grade import sandbox

    limits = options.limits
    boxed = f"bubblewrap, network off, as {sandbox.identity()}" if options.sandbox else "NONE (--no-sandbox)"
    print(f"labkit grade: limits: exercise {limits.cell_timeout:g} s, notebook {limits.notebook_timeout:g} s, "
          f"memory {limits.memory_gib:g} GiB, {limits.processes} processes and "
          f"{max(1, (os.cpu_count() or 1) // jobs)} CPU a box (kept by "
          f"{sandbox.kept_by() if options.sandbox else 'a watch from outside (polled)'}), /tmp and /dev/shm "
          f"{sandbox.TMP_BYTES // 2**20} MiB each, profile {limits.profile}, {jobs} at a time; sandbox: "
          f"{boxed}; hidden cases from seed {limits.seed}")


def _write_leaderboard(race: dict, book: Any, folder: Path) -> None:
    """leaderboard.csv and .html beside the gradebook."""
    from labkit.course.grade import leaderboard

    raced = dict(book.raced)
    leaderboard.fill(raced, book.rows)  # a row that says why for each lab 07 student not raced
    table = leaderboard.rows(race, raced)
    written = leaderboard.write(table, folder)
    ranked = sorted({r["student"] for r in table if r["rank"] != ""})
    print(f"labkit grade: leaderboard: {len(raced)} planners, {len(ranked)} ranked at some budget; written to "
          f"{written[0]} and {written[1]}")


def _write(run: _Run, book: Any) -> None:
    """The gradebook (a part's facts and signature with --shard), its summary and where it went."""
    from labkit.course.grade import report, shards, signature

    options, rows = run.options, book.rows
    unknown = sorted(set(run.points) - {r.exercise for r in rows})
    if unknown and options.shard is None:  # a part may hold no student of an exercise the table names
        print(f"labkit grade: --points names {', '.join(unknown)}, not an exercise graded here; those points count "
              "for nothing (each graded exercise it does not name is worth 1)", file=sys.stderr)
    part = None if options.shard is None else shards.facts(
        list(options.labs), options.limits.as_json(), *options.shard, roster=book.roster,
        exercises=shards.exercises_of(ROOT, list(options.labs)))
    if part is not None:
        print(f"labkit grade: part {options.shard[0]}/{options.shard[1]} of the class "
              f"({len({r.student for r in rows})} students); join the parts with `{MERGE} PART.csv...`")
    written = report.write(rows, run.out, run.as_json, options.limits.as_json(), run.points, part)
    if run.key is not None:
        signature.sign_files(run.out, run.as_json, run.key)
    print(report.summary(rows, run.points))
    print(f"labkit grade: {len(rows)} rows written to {run.out}" +
          (f"; one row per student, with points and totals, to {written}" if written != run.out else ""))


# ---------------------------------------------------------------- grade merge
def merge_parser() -> argparse.ArgumentParser:
    """`grade merge`'s own parser: the parts, and what is written; nothing of grading's."""
    p = argparse.ArgumentParser(prog=MERGE, description="Join the parts of a class graded with `grade --shard K/N` "
                                "into the gradebook one run writes, refusing parts that do not belong together "
                                "(each one's labs, limits, seed, K/N and roster are read from the part itself).")
    p.add_argument("parts", nargs="+", metavar="PART", help="the parts' gradebooks (CSV, each with its JSON beside "
                                                            "it, or the JSON)")
    p.add_argument("--out", default="grades.csv", help="the gradebook (default grades.csv)")
    p.add_argument("--points", help="a CSV of `exercise,points` lines (default: 1 point per exercise)")
    p.add_argument("--json", action="store_true", help="write JSON (limits and rows) instead of CSV")
    p.add_argument("--key", metavar="FILE", help="the key the parts were signed with (default "
                                                 "~/.config/labkit/grade.key)")
    p.add_argument("--unsigned", action="store_true", help="take parts that are not signed, saying so (refused "
                                                           "without it)")
    return p


def merge_main(words: list[str]) -> int:
    """`grade merge PART... [--out F] [--points F] [--json] [--key F] [--unsigned]`; grading's options refused."""
    parser = merge_parser()
    args, extra = parser.parse_known_args(words)
    if extra:
        grading = argparse.ArgumentParser(add_help=False)
        options(grading)
        if grading.parse_known_args(["x", *extra])[1]:  # not grading's either: argparse's own refusal
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        print(f"labkit grade merge: {' '.join(extra)}: for grading, not merging; merge grades nothing and takes what "
              "each part was graded as (labs, limits, profile, seed, K/N) from the parts; it takes PART..., --out, "
              "--points, --json, --key and --unsigned", file=sys.stderr)
        return 2
    return merge(args)


def merge(args: argparse.Namespace) -> int:
    """Join the parts into --out, or refuse them in one line."""
    from labkit.course.grade import report, shards, signature

    out, parts = Path(args.out), [Path(p) for p in args.parts]
    try:
        shards.check_out(out, args.json, parts)
        points = report.read_points(Path(args.points) if args.points else None)
        merged = shards.merge(parts, signature.Key.at(Path(args.key) if args.key else None), args.unsigned)
    except (OSError, ValueError) as e:
        print(f"labkit grade merge: {e}", file=sys.stderr)
        return 2
    try:
        book = report.write(merged.rows, out, args.json, merged.limits, points)
    except OSError as e:
        print(f"labkit grade merge: --out {out}: cannot be written ({e.strerror or e}: {e.filename or out})",
              file=sys.stderr)
        return 2
    if merged.unsigned:
        print(f"labkit grade merge: warning: {', '.join(merged.unsigned)} not signed, taken on their word "
              "(--unsigned): each was checked against itself, not against an edit that keeps it whole", file=sys.stderr)
    print(report.summary(merged.rows, points))
    print(f"labkit grade merge: {len(parts)} parts, {len({r.student for r in merged.rows})} students, "
          f"{len(merged.rows)} rows written to {out}" + (f"; one row per student, with points and totals, to {book}"
                                                         if book != out else ""))
    return 0
