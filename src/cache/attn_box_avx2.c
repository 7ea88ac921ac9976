/* AVX2 twin of e8kv_attn_box_tile_ref (attn_box.c): vpmaddubsw + vpmaddwd products, token pairs for the
 * values. The body, shared with the AVX-VNNI twin, is attn_box_impl.h. */
#define BOX_VNNI 0
#define BOX_TILE_FN e8kv_attn_box_tile_avx2
#include "attn_box_impl.h"
