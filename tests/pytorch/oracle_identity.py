"""An oracle-tier example trainer (examples/oracle, examples/state: their
accumcheck_torch.Recorder, made by example_session or by the example;
examples/ddp: its DistributedRecorder, each rank) run as it is, except
that its recorder writes the SHA-256 of the trained model
(examples/contract/identity.py digest) to FILE (a rank's: FILE.rank<r>)
when closed; with --plain the recorder is replaced by one that records
nothing and only writes that digest: the same run without the recorder.
ctest_driver.py --identity runs both and compares the digests (the
recorder never changes the run).  Ranks: torchrun's workers, or forked
by the example's --spawn (ACCUMCHECK_START_METHOD=fork, as CTest sets it).

    oracle_identity.py [--plain] --digest FILE -- EXAMPLE ARGS..."""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "contract"))
import identity  # noqa: E402

import accumcheck_torch  # noqa: E402


def main():
    cut = sys.argv.index("--")
    head, example = sys.argv[1:cut], sys.argv[cut + 1:]
    path = head[head.index("--digest") + 1]
    plain = "--plain" in head

    def write(model):
        import torch.distributed as dist

        ranked = dist.is_available() and dist.is_initialized()
        with open("%s.rank%d" % (path, dist.get_rank()) if ranked else path, "w") as f:
            f.write(identity.digest(model) + "\n")

    def digesting(cls):
        class Digesting(cls):
            """The recorder, digesting the model it recorded at close()."""

            def __init__(self, bundle, model, *args, **kwargs):
                super().__init__(bundle, model, *args, **kwargs)
                self.digested_model = model

            def close(self, *args, **kwargs):
                done = super().close(*args, **kwargs)
                write(self.digested_model)
                return done
        return Digesting

    class Unrecorded:
        """No recorder: the model digested at close()."""

        def __init__(self, bundle, model, *args, **kwargs):
            self.model = model

        def close(self, *args, **kwargs):
            write(self.model)

        def log_loss(self, *args, **kwargs):
            pass

    import accumcheck_torch.distributed as distributed

    accumcheck_torch.Recorder = Unrecorded if plain else digesting(accumcheck_torch.Recorder)
    distributed.DistributedRecorder = Unrecorded if plain else digesting(
        distributed.DistributedRecorder)
    sys.argv = example
    sys.path.insert(0, os.path.dirname(os.path.abspath(example[0])))
    runpy.run_path(example[0], run_name="__main__")


if __name__ == "__main__":
    main()
