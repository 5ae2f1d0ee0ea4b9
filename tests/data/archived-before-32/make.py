"""Build tests/data/archived-before-32 with heteroflow as of commit 4b69241 (before issue #32)."""
import json, shutil, sys
from pathlib import Path
import numpy as np

out = Path(sys.argv[1])
rng = np.random.default_rng(32)
lines = ["x,constant,flag,colour,count,label"]
for i in range(160):
    x = "" if i % 13 == 0 else f"{rng.normal():.4f}"
    flag = "" if i % 19 == 0 else ("true" if rng.random() < 0.5 else "False")
    colour = "NA" if i % 31 == 0 else rng.choice(["red", "green", " blue"])
    count = int(rng.integers(0, 9))
    label = int((float(x or 0) > 0) + (colour == "red"))
    lines.append(f"{x},5,{flag},{colour}, {count},{label}")
table = "\n".join(lines) + "\n"
from heteroflow.components.data.preprocess import preprocess
from heteroflow.components.training.step import train
from heteroflow.components.models.predict import load_archived
import tempfile
work = Path(tempfile.mkdtemp())
(work / "src").mkdir()
(work / "src" / "table.csv").write_text(table)
params = {"missing": "impute"}
r = preprocess(work / "src", work / "shards", num_workers=1, **params)
m = train(r.output_dir, work / "model", epochs=60, checkpoint_root=work / "ckpt")
if out.exists():
    shutil.rmtree(out)
out.mkdir(parents=True)
shutil.copytree(m.model_dir, out / "model")
(out / "table.csv").write_text(table)
rows = [
    {"x": 0.5, "constant": 5, "flag": "true", "colour": "red", "count": 3},
    {"x": None, "constant": 5, "flag": False, "colour": "purple", "count": 4},  # a gap, a value never seen
    {"x": -1.25, "constant": 7, "flag": None, "colour": None, "count": None},  # gaps everywhere, an unseen constant
    {"x": "2.5", "constant": "5", "flag": "TRUE", "colour": " blue", "count": " 8"},  # numbers as text
]
model = load_archived(out / "model")
features = model.features(rows)
expected = {"made_by": "heteroflow at commit 4b69241 (before issue #32), tests/data/archived-before-32/make.py",
            "params": params, "rows": rows, "features": features.tolist(),
            "predictions": model.predict(rows).tolist()}
(out / "expected.json").write_text(json.dumps(expected, indent=1))
shutil.copy(__file__, out / "make.py")
print(features.shape, expected["predictions"])
