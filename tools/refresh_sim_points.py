"""Re-run the simulations whose results ship in data/simulated/ (after a simulator change).

    python tools/refresh_sim_points.py

sarathi_headline's probes (21 simulations of 512 requests, about two minutes on two
cores). tests/test_capacity.py re-runs one of them and fails if the file is stale.
"""
from minillm.sim.capacity import SARATHI_POINTS_PATH, sarathi_headline, save_points

if __name__ == "__main__":
    cache: dict = {}
    headline = sarathi_headline(cache=cache)
    save_points(cache, SARATHI_POINTS_PATH)
    print(f"{len(cache)} load points written to {SARATHI_POINTS_PATH}")
    for name in ("strict", "relaxed"):
        print(name, headline[name]["capacity_req_s"], f"{headline[name]['ratio']:.2f}x")
