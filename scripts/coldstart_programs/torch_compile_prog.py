"""A torch.compile'd MLP block for `cold-start` (Inductor generates Triton kernels at step 1).

    cublaslt-probe cold-start -- python scripts/coldstart_programs/torch_compile_prog.py
"""
import torch


class Block(torch.nn.Module):
    def __init__(self, d=1024, h=4096):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, h)
        self.down = torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def make_step():
    with torch.device("cuda"):
        block = Block().to(torch.bfloat16)
    model = torch.compile(block)
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)

    def step():
        with torch.no_grad():
            model(x)
    return step
