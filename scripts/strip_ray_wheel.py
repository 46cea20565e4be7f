"""Make a ray wheel small enough to carry to the device for verl's GPU tests.

verl 0.9.1's ``verl.trainer.ppo.core_algos`` imports ``verl.protocol``, which imports ray
and tensordict, so its GPU tests need ray installed, though they never start it. The
device takes 64 MiB per call: this drops what ``import ray`` never loads (the GCS
server and raylet binaries, the runtime-env agent's vendored packages, ray's libraries
such as rllib and data) and rewrites RECORD, 44.6 -> 14.0 MB for ray 2.60.0 cp312.
``ray.init()`` does not work from the result.

    python scripts/strip_ray_wheel.py ray-2.60.0-cp312-...whl .verlwhl/ray-2.60.0-cp312-...whl

The folder used with it (``.verlwhl/``, 54 MB, ``gpu_session.sh verl``) holds cp312
wheels of: numpy 2.2.6, ray 2.60.0 (stripped), transformers 5.10.4, tokenizers 0.22.2,
verl 0.9.1, tensordict 0.14.3, omegaconf 2.4.0, codetiming 1.4.0 and what these import
(pyyaml, huggingface_hub, regex, safetensors, msgpack, rpds_py, protobuf,
charset_normalizer, filelock, fsspec, packaging, urllib3, anyio, certifi, orjson, click,
jsonschema, tqdm, httpcore, httpx, requests, idna, attrs, typing_extensions, h11,
importlib_metadata, referencing, cloudpickle, jsonschema_specifications, lazy_importer,
pyvers, zipp), installed with ``--no-deps``; torch's own dependencies (sympy) come
with the device's torch.
"""

import base64
import csv
import hashlib
import io
import os
import sys
import zipfile

REMOVE_FILES = {
    "ray/core/src/ray/gcs/gcs_server",
    "ray/core/src/ray/raylet/raylet",
    "ray/core/libjemalloc.so",
}
REMOVE_PREFIXES = (
    "ray/jars/", "ray/dashboard/client/build/", "ray/_private/runtime_env/agent/thirdparty_files/",
    "ray/rllib/", "ray/data/", "ray/serve/", "ray/tune/", "ray/train/", "ray/llm/",
)


def removed(name):
    return name in REMOVE_FILES or name.startswith(REMOVE_PREFIXES)


def _sha(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main(src, dst):
    zin = zipfile.ZipFile(src)
    names = zin.namelist()
    rec = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD"))
    eps = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/entry_points.txt"))
    # the serve and tune console scripts point into the removed packages
    ep = "".join(line for line in zin.read(eps).decode().splitlines(True)
                 if not line.startswith(("serve =", "tune =")))
    n_removed = 0
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in zin.infolist():
            if removed(info.filename):
                n_removed += 1
                continue
            if info.filename == rec:
                continue
            data = ep.encode() if info.filename == eps else zin.read(info.filename)
            zi = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            zi.external_attr = info.external_attr
            zout.writestr(zi, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        rows = []
        for row in csv.reader(io.StringIO(zin.read(rec).decode())):
            if not row or removed(row[0]):
                continue
            if row[0] == eps:
                row = [eps, _sha(ep.encode()), str(len(ep.encode()))]
            rows.append(row)
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        zi = zipfile.ZipInfo(rec, date_time=zin.getinfo(rec).date_time)
        zi.external_attr = zin.getinfo(rec).external_attr
        zout.writestr(zi, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    print(f"removed {n_removed} files: {os.path.getsize(src) / 1e6:.1f} -> "
          f"{os.path.getsize(dst) / 1e6:.1f} MB")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
