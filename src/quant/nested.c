/* Placeholder until this quantizer lands: every family here answers E8KV_ERROR_UNSUPPORTED. */
#include "codec.h"
size_t e8kv_quant_init_e8nest(e8kv_codec_t *codec, const e8kv_spec *spec) { (void)codec; (void)spec; return E8KV_ERR(UNSUPPORTED); }
size_t e8kv_quant_init_d4nest(e8kv_codec_t *codec, const e8kv_spec *spec) { (void)codec; (void)spec; return E8KV_ERR(UNSUPPORTED); }
