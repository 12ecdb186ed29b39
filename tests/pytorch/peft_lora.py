"""PEFT LoRA adapters under the Transformers Trainer, recorded (issue 43):
the tiny Llama of tests/frameworks/_tiny.py with LoRA adapters on its
attention projections (peft.get_peft_model: the base weights frozen, the
adapters' forward wrapped around theirs, dropout 0.1 on the adapters'
input), Trainer(gradient_accumulation_steps=4), SGD, the
AccumcheckCallback(head="causal_lm": the integration derives no loss from
a PeftModel by itself, and says so).  The case runs without the recorder and then with it
in one process (tests/frameworks/_transformers.py train, --identity): the
trained parameters (the adapters and the frozen base) must be the same
bits, and certify must PASS (Transformers 5.24.0 sums the window's tokens:
its sgd cell's PASS).

    peft_lora.py ACCUMCHECK WORK       # the CTest case: exit 0 when both hold, 77: no peft

The Python it runs in: ACCUMCHECK_PEFT_PYTHON, else a venv made once in
build/conformance/venvs/ (PEFT_SPEC, installed without dependencies: peft
needs nothing the Transformers venv lacks) layered on bench/conformance.py's
transformers==5.24.0 venv.  A venv pip cannot make (no registry) skips
(77), saying why."""

import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FRAMEWORKS = os.path.join(ROOT, "tests", "frameworks")
TRANSFORMERS = "transformers==5.24.0"
PEFT_SPEC = "peft==0.21.2"


def peft_python():
    """(python, None) with peft beside torch 2.13.0 and Transformers, or
    (None, why)."""
    if os.environ.get("ACCUMCHECK_PEFT_PYTHON"):
        return os.environ["ACCUMCHECK_PEFT_PYTHON"], None
    conf = os.path.join(ROOT, "bench", "conformance.py")
    p = subprocess.run([sys.executable, conf, "venv", TRANSFORMERS], capture_output=True, text=True)
    if p.returncode != 0:
        return None, "no %s venv: %s" % (TRANSFORMERS, p.stderr.strip()[-300:])
    base_py = p.stdout.strip().splitlines()[-1]
    d = os.path.join(ROOT, "build", "conformance", "venvs", "%s-on-%s" % (
        PEFT_SPEC.replace("==", "-"), TRANSFORMERS.replace("==", "-")))
    py = os.path.join(d, "bin", "python")
    done = os.path.join(d, ".installed")
    if os.path.exists(done):
        return py, None
    sites = [subprocess.run([base_py, "-c", "import site; print(site.getsitepackages()[0])"],
                            capture_output=True, text=True, check=True).stdout.strip()]
    with open(glob.glob(os.path.join(os.path.dirname(sites[0]), "site-packages",
                                     "_accumcheck_base.pth"))[0]) as f:
        sites.append(f.read().strip())  # .venv's: torch 2.13.0
    subprocess.run([sys.executable, "-m", "venv", "--clear", d], check=True)
    site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "_accumcheck_base.pth"), "w") as f:
        f.write("\n".join(sites) + "\n")
    p = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", PEFT_SPEC], capture_output=True, text=True)
    chk = subprocess.run([py, "-c", "import torch, transformers, peft; print(torch.__version__)"],
                         capture_output=True, text=True)
    if p.returncode != 0 or chk.returncode != 0 or not chk.stdout.startswith("2.13.0"):
        return None, "pip cannot install %s beside torch 2.13.0 and %s: %s" % (
            PEFT_SPEC, TRANSFORMERS, (p.stderr + chk.stderr).strip()[-300:])
    with open(done, "w") as f:
        f.write(PEFT_SPEC + "\n")
    return py, None


def case(argv):
    """The run itself (in the peft Python): _transformers.train, twice under
    --identity."""
    sys.path.insert(0, FRAMEWORKS)
    import _tiny
    from _transformers import train
    from peft import LoraConfig, get_peft_model

    a = _tiny.case_args(__doc__)
    model = _tiny.tiny_llama()
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                             target_modules=["q_proj", "v_proj"]))
    # The integration derives no loss from a PeftModel by itself (it says
    # so, exit 2): the head is named, as for a model of one's own.
    return _tiny.exit_on_refusal(train, a, model, optim="sgd", lr=0.1, head="causal_lm")


def main():
    if "--out" in sys.argv:
        case(sys.argv[1:])
        return 0
    tool, work = sys.argv[1], sys.argv[2]
    py, why = peft_python()
    if py is None:
        print("peft_lora: skipped: %s" % why)
        return 77
    subprocess.run(["rm", "-rf", work])
    os.makedirs(work)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), FRAMEWORKS]),
               PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1")
    ident = os.path.join(work, "identity")
    r = subprocess.run([py, os.path.abspath(__file__), "--out", os.path.join(work, "trace"),
                        "--identity", ident], capture_output=True, text=True, env=env)
    sys.stdout.write(r.stdout + r.stderr[-3000:])
    if r.returncode != 0:
        print("peft_lora: the case exited %d" % r.returncode)
        return 1
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from conformance import identity_of
    same = identity_of(ident)
    print("peft_lora: trained parameters with and without the recorder: %s" % same)
    c = subprocess.run([tool, "certify", "--contract", "--trace", os.path.join(work, "trace")],
                       capture_output=True, text=True)
    sys.stdout.write(c.stdout + c.stderr)
    if same != "bit-identical" or c.returncode != 0:
        print("peft_lora: FAILED (certify exited %d)" % c.returncode)
        return 1
    print("peft_lora: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
