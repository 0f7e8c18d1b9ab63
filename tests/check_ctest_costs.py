#!/usr/bin/env python3
"""Every test that tests/ctest_costs.cmake names exists and carries its COST, so that renaming a
slow test cannot silently send it back to the end of a clean build's ctest run.

    tests/check_ctest_costs.py CTEST BUILD_DIR COSTS_FILE
"""
import json
import re
import subprocess
import sys


def main(ctest, build_dir, costs_file):
    with open(costs_file, encoding="utf-8") as f:
        named = re.findall(r"\[=\[(.*?)\]=\]", f.read())
    listing = subprocess.run([ctest, "--test-dir", build_dir, "--show-only=json-v1"], capture_output=True,
                             text=True, check=True)
    costs = {}
    for test in json.loads(listing.stdout)["tests"]:
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        costs[test["name"]] = props.get("COST")
    missing = [n for n in named if n not in costs]
    no_cost = [n for n in named if n in costs and not costs[n]]
    for n in missing:
        print(f"{costs_file}: no test named '{n}' (renamed? update the list)")
    for n in no_cost:
        print(f"{costs_file}: '{n}' has no COST (is the file still in TEST_INCLUDE_FILES after the Catch cases?)")
    print(f"check_ctest_costs: {len(named)} slow tests named, {len(missing) + len(no_cost)} problems")
    return 1 if missing or no_cost or not named else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
