import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # spec_helpers
# tiny models: one thread avoids oversubscription on the shared 2-core CI/dev machines
torch.set_num_threads(1)
