"""A few small settled-tile decodes (fresh_keys) for compute-sanitizer: lengths on the device,
S_q 4, head dims 64 / 128 / 256, split and unsplit; checks against the decode without the
promise. PYTHONPATH=. compute-sanitizer --tool racecheck python .scratch/settled_sanitize.py"""
import torch
from common.variants import Variant
from task5 import attention as am

dev = "cuda"
g = torch.Generator(device=dev).manual_seed(3)
ok = True
for b, hq, hkv, sq, sk, d, lengths, fresh, splits in ((2, 8, 2, 1, 300, 128, True, 1, 2),
                                                      (1, 8, 2, 4, 200, 64, False, 4, None),
                                                      (2, 8, 2, 1, 100, 256, True, 1, 1)):
    q = torch.randn(b, hq, sq, d, device=dev, generator=g).half()
    k, v = (torch.randn(b, hkv, sk, d, device=dev, generator=g).half() for _ in "kv")
    lens = torch.tensor([sk, sk - 37][:b], device=dev, dtype=torch.int32) if lengths else None
    torch.cuda.synchronize()  # the inputs are settled: written before any decode
    a = am._decode_gqa(q, k, v, True, None, 1, None, lens, False, None, splits, None, None, None,
                       fresh)
    p = am._decode_gqa(q, k, v, True, None, 1, None, lens, False, None, splits, None, None, None)
    same = torch.equal(a, p)
    ok = ok and same
    print(f"B{b} Hq{hq}/Hkv{hkv} Sq{sq} Sk{sk} D{d} lengths {lengths} fresh {fresh} splits {splits}: "
          f"bit-equal {same}", flush=True)
torch.cuda.synchronize()
print("settled sanitize cases", "OK" if ok else "FAILED")
