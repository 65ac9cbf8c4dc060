"""Peak RSS of the chunked loss's forward + backward, eager and under torch.compile
(inductor), each in a fresh process: PYTHONPATH=. python benchmarks/chunked_loss/compiled_rss.py
[--out FILE]. 32,768 rows x 64 wide, GPT-2's 50,304-wide head, bf16 autocast on CPU: a
whole bf16 copy of the logits is 3.07 GiB, one chunk's fp32 logits 0.13 GiB. Two steps
each; peak RSS is the process's (ru_maxrss), so it includes torch and, compiled, inductor."""
import argparse, json, resource, subprocess, sys

N, C, V = 32768, 64, 50304


def child(mode: str) -> None:
    import torch
    from gpt.model.chunked_ce import linear_cross_entropy
    torch.manual_seed(0)
    h = torch.randn(N, C, requires_grad=True)
    w = (torch.randn(V, C) * 0.02).requires_grad_()
    t = torch.randint(0, V, (N,))

    def step(h, w, t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_cross_entropy(h * 1.0, w, t)

    fn = torch.compile(step, dynamic=False) if mode == "compiled" else step
    for _ in range(2):
        loss = fn(h, w, t)
        loss.backward()
    print(json.dumps({"loss": loss.item(), "peak_rss_gib": round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2])
        sys.exit()
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch
    out = {"rows": N, "width": C, "vocab": V, "torch": torch.__version__,
           "whole_bf16_logits_gib": round(N * V * 2 / 2**30, 3)}
    for mode in ("eager", "compiled"):
        run = subprocess.run([sys.executable, __file__, "--child", mode], check=True,
                             capture_output=True, text=True)
        out[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
