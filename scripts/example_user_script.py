"""A user's program as `cublaslt-probe capture -o RUN -- scripts/example_user_script.py` runs it (GPU):
a small bf16 two-layer MLP, three forward+backward steps."""
import torch

model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
model = model.to(torch.bfloat16)
x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    model(x).float().pow(2).mean().backward()
torch.cuda.synchronize()
