/* Where in its block an output of the CPU kernels starts (_ctoken.c's block cache, and
 * _cscan.c's replay, which takes blocks from that cache and keeps a few freed ones).
 *
 * The kernels walk their rows 64 bytes a step, the reverse scans downwards: a load of the
 * next inputs then follows the store of the last outputs by a few cache lines, and where
 * an output's address equals an input's in the low 12 bits (4 KiB aliasing) the core
 * takes the load as dependent on the store and stalls it. Torch's and numpy's large
 * tensors start 16 or 64 bytes past a page (ours did at 0: blocks are 2 MiB-aligned), so
 * outputs start 2 or 3 KiB past it instead, the two of a call at different ones: [4096,
 * 128] GAE into page-aligned outputs took 1.2x as long on the 2-core EPYC VM. */
#ifndef RL_TRITON_CORE_CBLOCKS_H
#define RL_TRITON_CORE_CBLOCKS_H

#include <stddef.h>
#include <stdint.h>

#define BLOCK_COLOR_SPAN 4096 /* bytes a block holds beyond its output, for the offset */

/* the offset in a block at mem of an output of color k (0 or 1) */
static inline size_t block_offset(const void *mem, unsigned k) {
    static const size_t colors[2] = {2048 + 64, 3072 + 64};
    return (colors[k & 1] - ((uintptr_t)mem & 4095)) & 4095;
}

#endif
