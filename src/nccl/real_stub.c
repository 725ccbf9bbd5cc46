/* Empty library whose SONAME is libnccl_real.so.2. Linking the interposer
 * against it records a NEEDED entry for libnccl_real.so.2, which at run time is
 * a symbolic link to the real libnccl.so.2 placed beside the interposer (found
 * through RUNPATH=$ORIGIN). Every NCCL function the interposer does not define
 * then resolves from the real library. */
void jax_amem_nccl_real_stub(void) {}
