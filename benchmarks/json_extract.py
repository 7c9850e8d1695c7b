"""Structured output on the bundled SmolLM2: a JSON-schema extraction, drafted against serial.

Side by side in one process, for one schema (an object of 10 fixed keys with enums, numbers,
bounded strings and two nested objects): decode tokens/s of the serial run and of the drafted
run (the tokens the schema forces verified as drafts, with and without prompt lookup), run in
turn within each repeat; their medians' ratio and the spread of each repeat's ratio; whether
the tokens were identical; the constraint's cost per serial decode step (every call into the
constraint during a serial run: masks, the row transform, the end check, timed against the
step); and over --seeds seeds at temperature 0.8, how many outputs parse and validate.

    python benchmarks/json_extract.py [--tokens 256] [--repeats 5] [--seeds 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "maxLength": 16},
        "issued": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP", "NOK"]},
        "status": {"type": "string", "enum": ["paid", "open", "overdue"]},
        "total": {"type": "number"},
        "items": {"type": "integer"},
        "seller": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 30},
            "vat_id": {"type": "string", "maxLength": 16}},
            "required": ["name", "country", "vat_id"], "additionalProperties": False},
        "buyer": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 30}},
            "required": ["name", "country"], "additionalProperties": False},
        "payment_terms": {"type": "string", "enum": ["net 15", "net 30", "net 60"]},
        "notes": {"type": "string", "maxLength": 60},
    },
    "required": ["invoice_number", "issued", "currency", "status", "total", "items", "seller",
                 "buyer", "payment_terms", "notes"],
    "additionalProperties": False,
}
DOCUMENT = ("Invoice INV-2291 was issued on 2026-03-14 by Nordlys Tools AS (Norway, VAT "
            "NO998877665) to Brightline Ltd (United Kingdom). It lists 3 items for a total of "
            "1249.50 NOK, payable net 30. The invoice is still open. Note: deliver to the back "
            "entrance.")
ASK = [{"role": "user", "content": "Extract the invoice below as JSON with the fields "
                                   "invoice_number, issued, currency, status, total, items, "
                                   "seller, buyer, payment_terms and notes.\n\n" + DOCUMENT}]


def timed_side_by_side(runs: dict, tokens: int, repeats: int) -> dict:
    """{name: (decode tokens/s of each repeat, the last result)} for runs {name: (generator,
    options)}, run in turn within each repeat (the order rotated every repeat), so a change in
    the machine's speed during the benchmark lands on every run alike."""
    names = list(runs)
    speeds: dict = {name: [] for name in names}
    results: dict = {}
    for repeat in range(repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]
        for name in order:
            generator, options = runs[name]
            results[name] = generator.generate(ASK, tokens, temperature=0.0, **options)
            speeds[name].append(results[name].stats.tokens_per_second)
    return {name: (speeds[name], results[name]) for name in names}


def constraint_cost(generator, constraint, tokens: int) -> tuple[float, float, float]:
    """(seconds the constraint takes per decode step inside a serial run: its mask, the row
    transform, the end check; of those, the seconds computing masks (llguidance's bitmask and
    its unpacking); seconds of a whole step), timing every call of
    exactdraft.constraints.rows.ConstraintRows during the run."""
    from exactdraft.constraints import ConstraintMatcher
    from exactdraft.constraints import rows as constrained

    spent = {"rows": 0.0, "masks": 0.0}
    originals = {(constrained.ConstraintRows, name): "rows"
                 for name in ("__call__", "ended", "cut", "forced", "complete")}
    originals[(ConstraintMatcher, "_compute_mask")] = "masks"

    def timed_method(method, key):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - started
        return run

    methods = {(owner, name): getattr(owner, name) for owner, name in originals}
    for (owner, name), key in originals.items():
        setattr(owner, name, timed_method(methods[owner, name], key))
    try:
        result = generator.generate(ASK, tokens, temperature=0.0, constraint=constraint,
                                    drafts=False)
    finally:
        for (owner, name), method in methods.items():
            setattr(owner, name, method)
    steps = max(len(result.tokens), 1)
    return spent["rows"] / steps, spent["masks"] / steps, result.stats.wall_seconds / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=50)
    args = parser.parse_args()

    import jsonschema

    import exactdraft as xd
    from exactdraft.constraints import Constraint
    from exactdraft.kernels import cpu

    constraint = Constraint.json_schema(SCHEMA)
    plain = xd.Generator.from_pretrained(None)
    lookup = xd.Generator.from_pretrained(None, drafter=xd.PromptLookup())
    print(f"SIMD level: {cpu.simd_level()}; SmolLM2-135M-Instruct Q4_1; "
          f"{args.tokens} tokens, median of {args.repeats}")
    measured = timed_side_by_side({
        "serial": (plain, {"constraint": constraint, "drafts": False}),
        "forced drafts": (plain, {"constraint": constraint}),
        "forced + lookup": (lookup, {"constraint": constraint}),
        "unconstrained serial": (plain, {"drafts": False})}, args.tokens, args.repeats)
    serial_speeds, serial = measured["serial"]
    serial_speed = statistics.median(serial_speeds)
    print(f"serial (constrained)       {serial_speed:7.1f} tok/s  "
          f"{serial.stats.target_passes} passes, finish {serial.finish_reason}")
    for name in ("forced drafts", "forced + lookup"):
        speeds, result = measured[name]
        speed = statistics.median(speeds)
        # The same repeat's runs ran back to back: their ratios show the spread.
        ratios = [a / b for a, b in zip(speeds, serial_speeds)]
        print(f"{name:<26} {speed:7.1f} tok/s  {speed / serial_speed:5.2f}x serial "
              f"(per repeat {min(ratios):.2f}-{max(ratios):.2f}x)  "
              f"{result.stats.tokens_per_pass:.2f} tokens/pass  identical: "
              f"{result.tokens == serial.tokens}")
    unconstrained_speed = statistics.median(measured["unconstrained serial"][0])
    print(f"unconstrained serial       {unconstrained_speed:7.1f} tok/s")
    cost, masks, step = constraint_cost(plain, constraint, args.tokens)
    print(f"constraint cost inside a serial run: {1000 * cost:.3f} ms per token against "
          f"{1000 * step:.2f} ms per step ({100 * cost / step:.1f}% of a step; computing "
          f"masks {1000 * masks:.3f} ms of it)")
    print("output:", serial.text)
    valid = 0
    for seed in range(args.seeds):
        result = lookup.generate(ASK, args.tokens, temperature=0.8, seed=seed,
                                 constraint=constraint)
        try:
            jsonschema.validate(json.loads(result.text), SCHEMA)
            valid += result.finish_reason == "stop"
        except (json.JSONDecodeError, jsonschema.ValidationError):
            pass
    print(f"temperature 0.8: {valid} of {args.seeds} seeds parse and validate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
