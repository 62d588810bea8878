"""Re-run the simulations whose results ship in data/simulated/ (after a simulator change).

    python tools/refresh_sim_points.py

sarathi_headline's probes (20 simulations of 512 requests) and the load points of the
lab setting chapter 7 opens with (its chunk sweep and capacity view, probes of
lab.LOAD_REQUESTS requests): about three minutes on two cores.
tests/test_capacity.py and tests/test_lab.py re-run one point of each file and fail
if it is stale.
"""
from minillm.book import lab
from minillm.sim.capacity import SARATHI_POINTS_PATH, sarathi_headline, save_points

# The setting chapter 7 opens the lab under load with (and the README's load_lab.png).
CHAPTER_7_LOAD = lab.LabSettings(workload="chat", rate_per_s=4.0, itl_slo_ms=100.0, ttft_slo_ms=2000.0)

if __name__ == "__main__":
    cache: dict = {}
    headline = sarathi_headline(cache=cache)
    save_points(cache, SARATHI_POINTS_PATH)
    print(f"{len(cache)} load points written to {SARATHI_POINTS_PATH}")
    for name in ("strict", "relaxed"):
        print(name, headline[name]["capacity_req_s"], f"{headline[name]['ratio']:.2f}x")
    lab.LAB.clear()                                # start empty: only what the chapter needs
    for chunk in (*lab.CHUNK_SIZES, lab.OFF):      # the widget's verdict at every chunk position
        lab.lab_verdict(CHAPTER_7_LOAD, chunk_size=chunk)
    lab.lab_figure(CHAPTER_7_LOAD)
    save_points(lab.LAB.load_points, lab.LAB_POINTS_PATH)
    print(f"{len(lab.LAB.load_points)} load points written to {lab.LAB_POINTS_PATH}")
    for row in lab.capacity_rows(CHAPTER_7_LOAD):
        print(row)
