package s3

// PartBuffers is how many part buffers st's writers hold now.
func PartBuffers(st *Store) int64 { return st.partBufs.Load() }
