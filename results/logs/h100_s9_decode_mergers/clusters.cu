// How many clusters of 2/4/8 blocks of the GQA decode's shape (256 threads, ~197 KB of shared
// memory, one block per SM) can be resident at once on this GPU (cudaOccupancyMaxActiveClusters).
#include <cstdio>
#include <cuda_runtime.h>
__global__ void probe(int* out) { extern __shared__ int s[]; if (threadIdx.x == 0 && out) out[blockIdx.x] = s[0]; }
int main() {
  int dev = 0; cudaDeviceProp prop; cudaGetDeviceProperties(&prop, dev);
  printf("%s: %d SMs\n", prop.name, prop.multiProcessorCount);
  for (int smem : {100 * 1024, 197 * 1024}) {
    cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    for (int cs : {1, 2, 4, 8, 16}) {
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = cs; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(128); cfg.blockDim = dim3(256); cfg.dynamicSmemBytes = smem;
      cfg.attrs = attr; cfg.numAttrs = 1;
      int n = -1;
      cudaError_t e = cudaOccupancyMaxActiveClusters(&n, probe, &cfg);
      printf("smem %d KB, cluster %2d: max active clusters %d (%d blocks) %s\n", smem / 1024, cs, n,
             n * cs, cudaGetErrorString(e));
    }
  }
  return 0;
}
