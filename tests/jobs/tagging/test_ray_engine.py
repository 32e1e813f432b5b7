import hashlib

import numpy as np
import pandas as pd
import pytest

from jobs.tagging.generate import TaggerSettings
from jobs.tagging.run import TagOptions, tag_catalog
from tests.jobs.tagging.factories import catalog_split, tiny_model_dir

pytest.importorskip("ray")


@pytest.mark.slow
def test_ray_and_local_engines_write_identical_tags_and_states(tmp_path):
    split = catalog_split(6)
    settings = TaggerSettings(precision="fp32", max_new_tokens=80, threads=1)
    kw = {"chunk_size": 4, "batch_size": 2, "progress": False}
    local = tag_catalog(split, str(tiny_model_dir()), tmp_path / "local", settings,
                        TagOptions(engine="local", **kw))
    ray = tag_catalog(split, str(tiny_model_dir()), tmp_path / "ray", settings,
                      TagOptions(engine="ray", ray_cpus=1, **kw))
    assert local["version"] == ray["version"] and ray["engine"] == "ray"
    a = pd.read_parquet(tmp_path / "local" / "tags" / "tags.parquet")
    b = pd.read_parquet(tmp_path / "ray" / "tags" / "tags.parquet")
    pd.testing.assert_frame_equal(a, b)
    np.testing.assert_array_equal(np.load(tmp_path / "local" / "tags" / "hidden.npy"),
                                  np.load(tmp_path / "ray" / "tags" / "hidden.npy"))
    for part in ("chunk-00000.parquet", "chunk-00001.parquet"):
        digest = [hashlib.sha256((tmp_path / e / "tags" / "parts" / part).read_bytes()).hexdigest()
                  for e in ("local", "ray")]
        assert digest[0] == digest[1]
