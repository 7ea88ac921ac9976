/* AVX-VNNI twin of e8kv_attn_box_tile_ref (attn_box.c): vpdpbusd products (u8 nibbles × s8 query or
 * weights, four per int32 lane), token quads for the values; half the product instructions of the AVX2
 * twin. Built with -mavxvnni where the compiler has it (CMakeLists.txt), called only when the CPU has it
 * (e8kv_cpu_has_avxvnni). The body is attn_box_impl.h. */
#define BOX_VNNI 1
#define BOX_TILE_FN e8kv_attn_box_tile_vnni
#include "attn_box_impl.h"
