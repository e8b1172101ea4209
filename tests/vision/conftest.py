import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tiny_vlms
# tiny models: one thread avoids oversubscription on the shared 2-core machines
torch.set_num_threads(1)
