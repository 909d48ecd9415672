/* soft_verbs.c: a software stand-in for libibverbs.so.1, for tests on machines without RDMA
 * hardware. It implements rdma-core's public verbs ABI (<infiniband/verbs.h>, used only as the
 * ABI; no rdma-core source is copied) and emulates reliable-connected (RC) queue pairs between
 * processes of one machine.
 *
 * Emulated:
 *   - SOFT_VERBS_DEVICES (1 to 4, default SV_DEFAULT_DEVICES: 1 unless built with
 *     -DSV_DEFAULT_DEVICES=n) devices "soft_0", "soft_1", ... (node type CA, transport IB), the
 *     functions of one adapter: each its own node GUID, one system image GUID. Each has
 *     SOFT_VERBS_PORTS (1 or 2) ports, each ACTIVE, link layer InfiniBand, MTU 4096, a rate of
 *     SOFT_VERBS_RATE_GBPS (default 100) expressed as active_width x active_speed; GID index 0
 *     = fe80::<guid>; pkey 0xffff. SOFT_VERBS_LINK_LAYER=eth makes every port RoCE: link
 *     layer Ethernet, LID 0, 4 GIDs (ibv_query_gid, _ibv_query_gid_ex with their types):
 *     0 link-local fe80:: RoCE v1, 1 the same RoCE v2, 2 IPv4-mapped ::ffff:10.x.y.z RoCE
 *     v1, 3 the same RoCE v2 (x.y.z: device, port, process). Moving a QP to RTR there needs a
 *     global address (is_global, a valid sgid_index, grh.dgid = the peer port's GID at that
 *     index, of the process dest_qp_num names), else ibv_modify_qp fails with EINVAL. A
 *     device's MRs serve only its own QPs (its PDs), as on hardware.
 *   - test-only queries (version SOFT_VERBS_TEST, not rdma-core's):
 *     uint64_t soft_verbs_rx_bytes(const char *name): how many payload bytes RDMA writes and
 *     sends delivered to a device's memory (0 for an unknown name);
 *     int soft_verbs_qp_facts(uint32_t qp_num, uint32_t *traffic_class, uint32_t *service_level,
 *     uint32_t *ece_options, uint32_t *max_inline): for a QP of this process, the traffic class
 *     (0 unless its RTR address was global) and service level its RTR transition set, its ECE
 *     wire options (below) and its max_inline_data; NULL out-pointers are skipped; 0, or
 *     ENOENT for a QP number not of this process.
 *   - PDs; MRs with lkey/rkey, iova (ibv_reg_mr_iova/_iova2), bounds and access-flag checks;
 *     registering memory the process cannot read (GPU memory: no peer-memory driver) fails
 *     with EFAULT, on-demand paging with EOPNOTSUPP; remote atomic access is granted.
 *   - CQs polled through context->ops.poll_cq (the inline ibv_poll_cq); resizing is not needed:
 *     a CQ grows instead of overrunning.
 *   - RC QPs: RESET/INIT/RTR/RTS/ERR via ibv_modify_qp, ibv_query_qp (caps included); the
 *     address's sl and (global addresses only) grh.traffic_class are remembered at RTR; RDMA
 *     WRITE, WRITE WITH IMM, READ, SEND, SEND WITH IMM; signaled/unsignaled; inline sends
 *     (cap.max_inline_data up to SV_MAX_INLINE, else ibv_create_qp fails with EINVAL; an
 *     IBV_SEND_INLINE request longer than the QP's max_inline_data is refused by
 *     ibv_post_send with EINVAL; inline data needs no lkey and is copied at post time, as
 *     every payload is); in-order completion per QP; errors
 *     (REM_ACCESS_ERR, REM_INV_REQ_ERR, LOC_PROT_ERR, LOC_LEN_ERR, RETRY_EXC_ERR) move the QP
 *     to ERR and flush what follows with WR_FLUSH_ERR. Receivers not ready behave like
 *     rnr_retry=7 (infinite): the request waits for a posted receive. The target QP's own
 *     qp_access_flags are enforced (remote write, remote read), and pkey index 0 is the only
 *     one. Payloads land in ascending address order, one store per aligned 8-byte word, as a
 *     NIC's DMA does: a consumer polling a word (NCCL's fifo index, LL flags) never sees it
 *     before the lower words of the same write.
 *   - ECE (Enhanced Connection Establishment) as mlx5 does it, with SOFT_VERBS_ECE=<mask>
 *     (strtoul base 0, read when the first device is opened). Unset or 0: ibv_query_ece and
 *     ibv_set_ece answer EOPNOTSUPP. A mask S: every QP offers S with vendor id 0x15b3;
 *     ibv_query_ece gives {0x15b3, accepted options if ibv_set_ece was called, else S,
 *     comp_mask 0}; ibv_set_ece (EINVAL for a NULL ece, another vendor id, a nonzero comp_mask
 *     or a QP past INIT) accepts ece->options & S. A QP's wire options are its accepted
 *     options once set, else 0 (legacy). The rule: both ends of an RC connection must have the
 *     same wire options. The requester's travel in the connection hello; the responder
 *     compares them with its QP's once that QP is past INIT (its options are final then: in
 *     NVIDIA's negotiation the requester reaches RTS, and connects, before the target has set
 *     the options it answered with) and, if they differ, refuses the connection by closing it,
 *     so the requester's work requests complete with IBV_WC_RETRY_EXC_ERR, as with no path.
 *     A QP connected to another of its own process follows the same rule.
 *   - InfiniBand subnets joined by routers, with NVIDIA's routable FLIDs:
 *     SOFT_VERBS_IB_SUBNET=<0..0xffff> (decimal or 0x hex, anything else counts as unset;
 *     read when the first device is opened; ignored with SOFT_VERBS_LINK_LAYER=eth). Unset:
 *     as above (one GID, LID routing, nothing checked). Set: every port of the process is in
 *     that subnet and has gid_tbl_len 2: GID 0 as above, GID 1 (type IB) in NVIDIA's routable
 *     layout fe80:0000:<FLID>:<subnet>:<GID 0's GUID> (bytes 4-5 the FLID, 6-7 the subnet,
 *     big-endian). Such a process takes a LID of 1..SV_FLID_LID_MAX (0x3ff); port p of its
 *     device d has the FLID SV_FLID_BASE (0xc000) + ((2d + p) << 10) + LID: 0xc401..0xe3ff,
 *     one for each port of each process, never a LID of such a process. Routing: a global
 *     address (is_global) whose dlid is a port's FLID and whose grh.dgid carries that FLID
 *     (bytes 4-5) goes to that FLID's port; any other dlid is a LID, as ever. In a process
 *     with a subnet, or towards a FLID, a global RTR address needs an sgid_index below
 *     gid_tbl_len, else ibv_modify_qp fails with EINVAL. The requester tells the responder
 *     its subnet (or none) and its address (is_global, dlid, grh.dgid) in the connection
 *     hello. Where either end has a subnet the responder checks them against its QP's port
 *     once that QP is past INIT (as for ECE): a requester without a subnet counts as subnet
 *     0 (its GID 0's); a global address must name one of the port's GIDs; a requester of
 *     another subnet must be global, to the port's FLID and its GID 1 (NVIDIA's address
 *     across subnets); one of the same subnet may use the LID or the FLID. Else the
 *     connection is refused as an ECE mismatch is, by closing it: the requester's work
 *     requests complete with IBV_WC_RETRY_EXC_ERR, as with no path.
 *   - what NVIDIA's NCCL IB transport needs to run over it (host memory): NVIDIA_IB.md.
 *   - fault injection: SOFT_VERBS_FAIL_AFTER=N (read when a QP is created): the N+1-th and
 *     later work requests posted on that QP complete with IBV_WC_RETRY_EXC_ERR (then flush);
 *     with SOFT_VERBS_FAIL_DEVICE=name only the QPs of that device fail;
 *     SOFT_VERBS_PORT_DOWN_AFTER_MS=T: T ms after ibv_open_device the ports go DOWN and each
 *     open context gets IBV_EVENT_PORT_ERR (ibv_get_async_event / ibv_ack_async_event).
 *     SOFT_VERBS_MODIFY_QP_BUSY=N: the first N calls of ibv_modify_qp in the process change
 *     nothing and return ETIMEDOUT, as a busy subnet manager or firmware can make them.
 *
 * Not emulated: UD/UC/XRC QPs, SRQs, atomics (posting one fails with EINVAL), memory windows,
 * address handles, multicast, completion channels (ibv_create_comp_channel fails with ENOSYS),
 * dmabuf MRs (EOPNOTSUPP), extended QP/CQ (ibv_qp_ex, ibv_cq_ex), the sysfs gid_attrs of
 * RoCE ports (scripts/ib-sysfs-ns.sh writes them in a mount namespace for NVIDIA's NCCL),
 * fork() after the device was opened, the IBVERBS_1.0 compatibility symbols, and
 * the private provider interface (IBVERBS_PRIVATE_*).
 * The verbs_context extension is present (abi_compat = extended) with query_port filled in;
 * every other extended op is NULL, so the inline helpers that need one answer EOPNOTSUPP.
 *
 * Design (why not process_vm_readv/writev): each process is its own "NIC". Identity is
 * (LID or FLID, QP number), exchanged out of band as with real hardware. A process claims a
 * unique LID by binding the abstract Unix socket "@soft_verbs.lid.<lid>" (binding is atomic
 * and the name disappears when the process dies, so this is the machine-wide registry); QP
 * numbers are (lid << 10) | index, hence unique per machine. A QP moving to RTS connects a
 * stream socket to its peer's process, naming the peer QP. The requester writes requests
 * (with the payload of writes and sends) on that socket; in the target process a responder
 * thread does the memory access itself, after checking the rkey, bounds and access flags
 * against its own MR table, and answers; a requester thread reads the answers and produces
 * send completions in order. Memory is only ever touched by its own process, which needs no
 * ptrace permission (process_vm_* may be refused by Yama or in containers) and is how a real
 * target NIC works: checks happen at the target. Deadlock freedom: a requester-side reader
 * only reads, the responder only writes to a socket drained by such a reader, so every
 * blocking write drains. A connection that is lost (peer gone, ECE or subnets refused) leaves
 * the QP without a path: what is outstanding and whatever is posted later completes with
 * IBV_WC_RETRY_EXC_ERR.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <endian.h>

#define SV_EXPORT __attribute__((visibility("default")))
#define SV_MAX_SGE 16
#define SV_MAX_QP_PER_PROC 1024
#define SV_MAX_WR 8192
#define SV_LID_MAX 0x3fff
/* "sofx": a hello with ECE options and the requester's subnet and address ("sofw" had neither
 * of the latter, "sofv" no ECE options either) */
#define SV_HELLO_MAGIC 0x736f6678u
#define SV_BOUNCE (256 * 1024) /* payload staging of one reader thread */
#define SV_MAX_DEVICES 4
#define SV_ETH_GIDS 4 /* GID table of an Ethernet port */
#define SV_MAX_INLINE 256 /* the largest cap.max_inline_data a QP may ask for */
#define SV_ECE_VENDOR 0x15b3 /* Mellanox's PCI vendor id, which mlx5 reports as ECE vendor */
/* SOFT_VERBS_IB_SUBNET: the port's routable FLID (GID 1, bytes 4-5) is
 * SV_FLID_BASE + ((2 * device + port) << 10) + LID, for a process LID of 1..SV_FLID_LID_MAX
 * (such a process claims its LID there): 0xc401..0xe3ff, a FLID for each port of each device
 * of every process, none equal to a LID of such a process (their bits 10-13 are clear). */
#define SV_FLID_BASE 0xc000
#define SV_FLID_LID_MAX 0x3ff
#define SV_IB_ROUTABLE_GIDS 2 /* GID table of an InfiniBand port with a subnet */
#define SV_NO_SUBNET 0xffffffffu /* the hello's subnet of a requester without one */
#ifndef SV_DEFAULT_DEVICES
#define SV_DEFAULT_DEVICES 1
#endif

/* ---------------------------------------------------------------- process-wide state */

struct sv_qp;

static struct {
  pthread_mutex_t mu;
  int initialized;
  uint16_t lid;
  int listen_fd;
  pthread_t listener;
  struct sv_qp *qps[SV_MAX_QP_PER_PROC];
  /* MR table: simple array, looked up by key */
  struct sv_mr **mrs;
  int nmrs, capmrs;
  uint32_t next_key;
  int ports;
  int rate_gbps;
  int eth; /* SOFT_VERBS_LINK_LAYER=eth: RoCE ports */
  int port_down;
  uint32_t ece_mask; /* SOFT_VERBS_ECE: the ECE options every QP offers; 0: no ECE */
  int subnet_set;    /* SOFT_VERBS_IB_SUBNET was given (InfiniBand ports only) */
  uint16_t subnet;   /* its value: the subnet of every port, GID 1 bytes 6-7 */
  struct sv_context *ctxs[64];
} G = {.mu = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1};

struct sv_device {
  struct ibv_device dev;
  uint64_t guid; /* the node GUID */
  int index;
  uint64_t rx_bytes; /* payload delivered to this device's memory */
};
static struct sv_device g_devices[SV_MAX_DEVICES];
static int g_ndevices;
/* The adapter's system image GUID: device 0's node GUID. Host order; returned big-endian. */
#define SV_SYS_IMAGE_GUID 0x0002c90300a1b2c0ull

struct sv_context {
  struct verbs_context vctx; /* ibv_context is its last member */
  int async_pipe[2];
};

struct sv_mr {
  struct ibv_mr mr;
  char *base;    /* local address of iova */
  uint64_t iova; /* address remote peers and SGEs use */
  uint64_t len;
  int access;
};

struct sv_cq {
  struct ibv_cq cq;
  pthread_mutex_t mu;
  struct ibv_wc *ring;
  int cap, head, count;
};

struct sv_pending { /* one posted send-queue work request awaiting its answer */
  uint64_t wr_id;
  enum ibv_wc_opcode opcode;
  int signaled;
  int local_status; /* nonzero: fails locally with this status when it reaches the head */
  uint32_t byte_len;
  int num_sge;
  struct ibv_sge sge[SV_MAX_SGE];
};

struct sv_recv {
  uint64_t wr_id;
  int num_sge;
  struct ibv_sge sge[SV_MAX_SGE];
};

struct sv_qp {
  struct ibv_qp qp;
  int index;
  pthread_mutex_t mu; /* state, attrs, fifo, recv queue */
  pthread_cond_t cond;
  pthread_mutex_t send_mu; /* serializes post_send: fifo order == wire order */
  struct ibv_qp_attr attr;
  struct ibv_qp_cap cap;
  int sq_sig_all;
  uint64_t fail_after; /* 0 = never */
  uint32_t sl, tc;     /* service level, traffic class (0 unless global) set at RTR */
  /* ECE: the accepted options once ibv_set_ece was called (ece_set), else none (legacy);
   * peer_ece: the requester's wire options, from the hello of the connection to this QP */
  uint32_t ece_accepted;
  int ece_set;
  uint32_t peer_ece;
  /* the requester's subnet (SV_NO_SUBNET: none) and address (is_global, dlid, grh.dgid), from
   * the same hello; checked against this QP's port once past INIT, as the ECE options are */
  uint32_t peer_subnet;
  int peer_global;
  uint16_t peer_dlid;
  uint8_t peer_dgid[16];
  uint64_t posted;
  /* requester side */
  int out_fd;
  pthread_t out_thread;
  int out_started;
  int path_lost; /* the connection is gone: what is posted fails with RETRY_EXC_ERR */
  struct sv_pending *fifo;
  int fifo_cap, fifo_head, fifo_count;
  /* responder side */
  int in_fd;
  pthread_t in_thread;
  int in_started;
  int resp_error;
  struct sv_recv *rq;
  int rq_cap, rq_head, rq_count;
  int destroying;
};

enum { SV_OP_WRITE = 1, SV_OP_WRITE_IMM, SV_OP_SEND, SV_OP_SEND_IMM, SV_OP_READ };

struct sv_req {
  uint32_t op;
  uint32_t imm; /* network order, passed through */
  uint64_t raddr;
  uint32_t rkey;
  uint32_t pad;
  uint64_t len;
};

struct sv_rsp {
  uint32_t status; /* enum ibv_wc_status */
  uint32_t pad;
  uint64_t len;
};

struct sv_hello {
  uint32_t magic;
  uint32_t dst_qpn;
  uint32_t src_qpn;
  uint32_t src_lid;
  uint32_t ece; /* the requester QP's ECE wire options */
  uint32_t subnet; /* the requester's SOFT_VERBS_IB_SUBNET, SV_NO_SUBNET when unset */
  uint32_t global; /* how it addressed the responder: its RTR ah_attr's is_global, */
  uint32_t dlid;   /* dlid */
  uint8_t dgid[16]; /* and grh.dgid (zero unless global) */
};

/* ---------------------------------------------------------------- helpers */

static int readn(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int drain(int fd, uint64_t n) {
  char tmp[65536];
  while (n) {
    size_t k = n < sizeof tmp ? (size_t)n : sizeof tmp;
    if (readn(fd, tmp, k)) return -1;
    n -= k;
  }
  return 0;
}

/* Writes all of iov (modified in place). */
static int writev_all(int fd, struct iovec *iov, int cnt) {
  while (cnt > 0) {
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)cnt;
    ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -1;
    while (cnt > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      cnt--;
    }
    if (cnt > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

/* Copies n bytes in ascending address order, each aligned 8-byte word with a single store, so
 * that a consumer polling a word of the destination (NCCL's fifo index, its LL flags) sees it
 * change only once every lower word of the same transfer is in place, as with a NIC's DMA
 * writes (a bulk read() into the destination gives no such order). */
static void ordered_copy(char *dst, const char *src, size_t n) {
  size_t i = 0;
  for (; i < n && ((uintptr_t)(dst + i) & 7); i++)
    __atomic_store_n((uint8_t *)(dst + i), (uint8_t)src[i], __ATOMIC_RELEASE);
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, src + i, 8);
    __atomic_store_n((uint64_t *)(void *)(dst + i), w, __ATOMIC_RELEASE);
  }
  for (; i < n; i++) __atomic_store_n((uint8_t *)(dst + i), (uint8_t)src[i], __ATOMIC_RELEASE);
}

/* Reads n payload bytes from fd into dst through bounce (SV_BOUNCE bytes), in order. */
static int read_ordered(int fd, char *dst, uint64_t n, char *bounce) {
  while (n) {
    size_t k = n < SV_BOUNCE ? (size_t)n : SV_BOUNCE;
    if (readn(fd, bounce, k)) return -1;
    ordered_copy(dst, bounce, k);
    dst += k;
    n -= k;
  }
  return 0;
}

static int write_all(int fd, const void *buf, size_t n) {
  struct iovec v = {(void *)buf, n};
  return writev_all(fd, &v, 1);
}

static int env_int(const char *name, int dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  return atoi(s);
}

/* A number of 0..0xffff written in decimal or 0x hex, nothing else: 1 and *out, else 0. */
static int parse_u16(const char *s, uint16_t *out) {
  int hex = s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  const char *d = s + (hex ? 2 : 0);
  unsigned long v = 0;
  if (!*d) return 0;
  for (; *d; d++) {
    int c = *d;
    int x = c >= '0' && c <= '9'         ? c - '0'
            : hex && c >= 'a' && c <= 'f' ? c - 'a' + 10
            : hex && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : -1;
    if (x < 0) return 0;
    v = v * (hex ? 16 : 10) + (unsigned long)x;
    if (v > 0xffff) return 0;
  }
  *out = (uint16_t)v;
  return 1;
}

static void lid_sockaddr(uint16_t lid, struct sockaddr_un *a, socklen_t *len) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "soft_verbs.lid.%u", (unsigned)lid);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ---------------------------------------------------------------- InfiniBand subnets */

/* How many GIDs an InfiniBand port has: 2 with SOFT_VERBS_IB_SUBNET (the routable one at
 * index 1), else 1. */
static int ib_gids(void) { return G.subnet_set ? SV_IB_ROUTABLE_GIDS : 1; }

/* The routable FLID of port `port` of device `dev` of the process with LID `lid` (one with a
 * subnet, so lid <= SV_FLID_LID_MAX). */
static uint16_t ib_flid(uint16_t lid, int dev, int port) {
  return (uint16_t)(SV_FLID_BASE + ((2 * dev + port) << 10) + lid);
}

/* Whether `flid` is the FLID of a port (of any process): that process's LID in *lid, the
 * device and the port in *dev and *port. */
static int flid_port(uint16_t flid, uint16_t *lid, int *dev, int *port) {
  if (flid < SV_FLID_BASE) return 0;
  int k = (flid - SV_FLID_BASE) >> 10; /* 2 * device + port */
  uint16_t l = (uint16_t)(flid & SV_FLID_LID_MAX);
  if (k < 1 || k > 2 * SV_MAX_DEVICES || l < 1) return 0;
  *lid = l;
  *dev = (k - 1) / 2;
  *port = (k - 1) % 2 + 1;
  return 1;
}

/* GID `index` of InfiniBand port `port` of device `dev` of this process: 0 the link-local
 * fe80::<port GUID>; 1 (with a subnet) NVIDIA's routable layout, fe80:0000:<FLID>:<subnet>
 * then the same GUID. The GUID is per process, device and port. */
static void ib_gid(int dev, int port, int index, union ibv_gid *gid) {
  memset(gid, 0, sizeof *gid);
  gid->raw[0] = 0xfe;
  gid->raw[1] = 0x80;
  if (index == 1) {
    uint16_t flid = ib_flid(G.lid, dev, port);
    gid->raw[4] = (uint8_t)(flid >> 8);
    gid->raw[5] = (uint8_t)flid;
    gid->raw[6] = (uint8_t)(G.subnet >> 8);
    gid->raw[7] = (uint8_t)G.subnet;
  }
  uint64_t g = SV_SYS_IMAGE_GUID + ((uint64_t)dev << 8) + (uint64_t)G.lid * 4 + (uint64_t)port;
  for (int i = 0; i < 8; i++) gid->raw[8 + i] = (uint8_t)(g >> (56 - 8 * i));
}

/* Whether an InfiniBand address routes by FLID, as NVIDIA addresses a port of another subnet:
 * global, its dlid the FLID of a port, and grh.dgid carrying that FLID (bytes 4-5). The
 * FLID's process LID in *lid. Any other dlid is a LID, routed as ever. */
static int flid_route(const struct ibv_ah_attr *ah, uint16_t *lid) {
  int dev, port;
  uint16_t l;
  if (!ah->is_global || !flid_port(ah->dlid, &l, &dev, &port) ||
      ah->grh.dgid.raw[4] != (uint8_t)(ah->dlid >> 8) || ah->grh.dgid.raw[5] != (uint8_t)ah->dlid)
    return 0;
  *lid = l;
  return 1;
}

static struct sv_context *sv_ctx(struct ibv_context *c) {
  return (struct sv_context *)((char *)c - offsetof(struct sv_context, vctx.context));
}

/* ---------------------------------------------------------------- MR table */

/* Caller holds G.mu. */
static struct sv_mr *mr_find(uint32_t key) {
  for (int i = 0; i < G.nmrs; i++)
    if (G.mrs[i]->mr.lkey == key) return G.mrs[i];
  return NULL;
}

/* Checks that [addr, addr+len) lies in the MR named by key, in pd, with the access bits
 * `need`; returns the local pointer or NULL. */
static char *mr_check(uint32_t key, struct ibv_pd *pd, uint64_t addr, uint64_t len, int need) {
  char *p = NULL;
  pthread_mutex_lock(&G.mu);
  struct sv_mr *m = mr_find(key);
  if (m && m->mr.pd == pd && (m->access & need) == need && addr >= m->iova &&
      len <= m->len && addr - m->iova <= m->len - len)
    p = m->base + (addr - m->iova);
  pthread_mutex_unlock(&G.mu);
  return p;
}

/* ---------------------------------------------------------------- CQ */

static void cq_push(struct ibv_cq *cq, const struct ibv_wc *wc) {
  struct sv_cq *c = (struct sv_cq *)cq;
  pthread_mutex_lock(&c->mu);
  if (c->count == c->cap) { /* grow rather than overrun */
    int ncap = c->cap * 2;
    struct ibv_wc *n = calloc((size_t)ncap, sizeof *n);
    if (!n) abort();
    for (int i = 0; i < c->count; i++) n[i] = c->ring[(c->head + i) % c->cap];
    free(c->ring);
    c->ring = n;
    c->cap = ncap;
    c->head = 0;
  }
  c->ring[(c->head + c->count) % c->cap] = *wc;
  c->count++;
  pthread_mutex_unlock(&c->mu);
}

static int sv_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc) {
  struct sv_cq *c = (struct sv_cq *)cq;
  int n = 0;
  pthread_mutex_lock(&c->mu);
  while (n < num && c->count) {
    wc[n++] = c->ring[c->head];
    c->head = (c->head + 1) % c->cap;
    c->count--;
  }
  pthread_mutex_unlock(&c->mu);
  return n;
}

static int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only) {
  (void)cq;
  (void)solicited_only;
  return EOPNOTSUPP;
}

/* ---------------------------------------------------------------- QP internals */

static void send_cqe(struct sv_qp *q, struct sv_pending *p, enum ibv_wc_status st) {
  if (st == IBV_WC_SUCCESS && !p->signaled) return;
  struct ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  wc.wr_id = p->wr_id;
  wc.status = st;
  wc.opcode = p->opcode;
  wc.byte_len = p->byte_len;
  wc.qp_num = q->qp.qp_num;
  wc.src_qp = q->attr.dest_qp_num;
  cq_push(q->qp.send_cq, &wc);
}

/* Caller holds q->mu. Moves the QP to ERR: flushes the send fifo and the receive queue. */
static void qp_to_error_locked(struct sv_qp *q) {
  q->qp.state = IBV_QPS_ERR;
  q->attr.qp_state = IBV_QPS_ERR;
  while (q->fifo_count) {
    send_cqe(q, &q->fifo[q->fifo_head], IBV_WC_WR_FLUSH_ERR);
    q->fifo_head = (q->fifo_head + 1) % q->fifo_cap;
    q->fifo_count--;
  }
  while (q->rq_count) {
    struct ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    wc.wr_id = q->rq[q->rq_head].wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qp.qp_num;
    cq_push(q->qp.recv_cq, &wc);
    q->rq_head = (q->rq_head + 1) % q->rq_cap;
    q->rq_count--;
  }
  pthread_cond_broadcast(&q->cond);
}

/* Caller holds q->mu: completes the head with status `st`, then everything after it flushes. */
static void fail_head_locked(struct sv_qp *q, enum ibv_wc_status st) {
  if (q->fifo_count) {
    send_cqe(q, &q->fifo[q->fifo_head], st);
    q->fifo_head = (q->fifo_head + 1) % q->fifo_cap;
    q->fifo_count--;
  }
  qp_to_error_locked(q);
}

/* Caller holds q->mu: a head that failed locally (fault injection, bad lkey) completes now. */
static void settle_head_locked(struct sv_qp *q) {
  if (q->fifo_count && q->fifo[q->fifo_head].local_status)
    fail_head_locked(q, (enum ibv_wc_status)q->fifo[q->fifo_head].local_status);
}

/* Requester side: reads answers, produces send completions in order. */
static void *out_reader(void *arg) {
  struct sv_qp *q = arg;
  char *bounce = malloc(SV_BOUNCE);
  for (;;) {
    if (!bounce) break;
    struct sv_rsp r;
    if (readn(q->out_fd, &r, sizeof r)) break;
    pthread_mutex_lock(&q->mu);
    if (q->qp.state == IBV_QPS_ERR || !q->fifo_count) {
      /* answers after an error are stale; READ data still has to be consumed */
      pthread_mutex_unlock(&q->mu);
      if (r.status == IBV_WC_SUCCESS && r.len && drain(q->out_fd, r.len)) break;
      continue;
    }
    struct sv_pending *p = &q->fifo[q->fifo_head]; /* stable: only this thread pops */
    pthread_mutex_unlock(&q->mu);
    int io_err = 0;
    if (r.status == IBV_WC_SUCCESS && p->opcode == IBV_WC_RDMA_READ) {
      uint64_t left = r.len;
      for (int i = 0; i < p->num_sge && left && !io_err; i++) {
        uint64_t k = p->sge[i].length < left ? p->sge[i].length : left;
        if (read_ordered(q->out_fd, (char *)(uintptr_t)p->sge[i].addr, k, bounce)) io_err = 1;
        left -= k;
      }
      if (!io_err && left && drain(q->out_fd, left)) io_err = 1;
    }
    pthread_mutex_lock(&q->mu);
    if (io_err) {
      fail_head_locked(q, IBV_WC_RETRY_EXC_ERR);
      pthread_mutex_unlock(&q->mu);
      break;
    }
    if (q->qp.state != IBV_QPS_ERR && q->fifo_count) {
      if (r.status != IBV_WC_SUCCESS) {
        fail_head_locked(q, (enum ibv_wc_status)r.status);
      } else {
        send_cqe(q, p, IBV_WC_SUCCESS);
        q->fifo_head = (q->fifo_head + 1) % q->fifo_cap;
        q->fifo_count--;
        settle_head_locked(q);
      }
    }
    pthread_mutex_unlock(&q->mu);
  }
  /* connection lost: whatever is outstanding never gets an answer (transport retries
   * exhausted), unless the QP is being torn down; nor does what is posted later */
  pthread_mutex_lock(&q->mu);
  q->path_lost = 1;
  if (!q->destroying && q->fifo_count && q->qp.state != IBV_QPS_ERR)
    fail_head_locked(q, IBV_WC_RETRY_EXC_ERR);
  pthread_mutex_unlock(&q->mu);
  free(bounce);
  return NULL;
}

/* Responder: waits for the QP to be able to receive (RTR or RTS) and, if need_recv, for a
 * posted receive (infinite RNR retry). Returns 0 when ready (the receive, if any, is copied to
 * *rcv and popped), -1 if the QP is in error or being destroyed. */
static int resp_wait(struct sv_qp *q, int need_recv, struct sv_recv *rcv) {
  pthread_mutex_lock(&q->mu);
  for (;;) {
    if (q->destroying || q->qp.state == IBV_QPS_ERR || q->resp_error) {
      pthread_mutex_unlock(&q->mu);
      return -1;
    }
    int ready = q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS ||
                q->qp.state == IBV_QPS_SQD || q->qp.state == IBV_QPS_SQE;
    if (ready && (!need_recv || q->rq_count)) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&q->cond, &q->mu, &ts);
  }
  if (need_recv) {
    *rcv = q->rq[q->rq_head];
    q->rq_head = (q->rq_head + 1) % q->rq_cap;
    q->rq_count--;
  }
  pthread_mutex_unlock(&q->mu);
  return 0;
}

static void recv_cqe(struct sv_qp *q, uint64_t wr_id, enum ibv_wc_status st,
                     enum ibv_wc_opcode op, uint32_t len, int with_imm, uint32_t imm) {
  struct ibv_wc wc;
  memset(&wc, 0, sizeof wc);
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = len;
  wc.qp_num = q->qp.qp_num;
  wc.src_qp = q->attr.dest_qp_num;
  wc.slid = q->attr.ah_attr.dlid;
  if (with_imm) {
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.imm_data = imm;
  }
  cq_push(q->qp.recv_cq, &wc);
}

/* Responder error: the QP goes to ERR (flushing its receives) and stops answering. */
static void resp_fail(struct sv_qp *q) {
  pthread_mutex_lock(&q->mu);
  q->resp_error = 1;
  qp_to_error_locked(q);
  pthread_mutex_unlock(&q->mu);
}

static int respond(struct sv_qp *q, uint32_t status, uint64_t len) {
  struct sv_rsp r = {status, 0, len};
  return write_all(q->in_fd, &r, sizeof r);
}

/* Responder side: performs the peer's requests on this process's memory. */
/* Whether the responder QP grants remote access `need` (its INIT qp_access_flags). */
static int qp_allows(struct sv_qp *q, int need) {
  pthread_mutex_lock(&q->mu);
  int ok = ((int)q->attr.qp_access_flags & need) == need;
  pthread_mutex_unlock(&q->mu);
  return ok;
}

static void count_rx(struct sv_qp *q, uint64_t n);

/* Caller holds q->mu. The ECE options q's connections must agree on: the accepted ones once
 * ibv_set_ece was called, else 0 (legacy, as a QP of a process without ECE). */
static uint32_t ece_wire_locked(const struct sv_qp *q) {
  return q->ece_set ? q->ece_accepted : 0;
}

/* Responder: whether the requester of the connection to q agrees with q's ECE options. Waits
 * for q to be past INIT first: only then are its options final (in NVIDIA's negotiation the
 * requester connects at its RTS, before the target has set the options it answered with).
 * Past INIT includes ERR: a refused connection is refused whatever became of the QP. A QP
 * being destroyed agrees: it serves nothing anyway. */
static int ece_agrees(struct sv_qp *q) {
  pthread_mutex_lock(&q->mu);
  while (!q->destroying && (q->qp.state == IBV_QPS_RESET || q->qp.state == IBV_QPS_INIT))
    pthread_cond_wait(&q->cond, &q->mu); /* every state change broadcasts */
  int same = q->destroying || ece_wire_locked(q) == q->peer_ece;
  pthread_mutex_unlock(&q->mu);
  return same;
}

static struct sv_device *sv_dev(struct ibv_device *device);

/* Caller holds q->mu, q past INIT (its port is set). Whether the requester of the connection
 * to q reached q's port by a path that exists. Without subnets on either end, any (as
 * before SOFT_VERBS_IB_SUBNET). Else a requester without one counts as subnet 0 (that of a
 * GID 0); a global address must name one of the port's GIDs (grh.dgid); a requester of
 * another subnet must have come through the routers: global, to the port's FLID (dlid) and
 * its routable GID 1 (grh.dgid). RoCE ports have no subnets. */
static int subnet_agrees_locked(const struct sv_qp *q) {
  if (G.eth || (!G.subnet_set && q->peer_subnet == SV_NO_SUBNET)) return 1;
  struct sv_device *v = sv_dev(q->qp.context->device);
  int dev = v ? v->index : 0;
  int port = q->attr.port_num;
  union ibv_gid g0, g1;
  ib_gid(dev, port, 0, &g0);
  ib_gid(dev, port, 1, &g1);
  int to_g1 = G.subnet_set && !memcmp(q->peer_dgid, g1.raw, sizeof g1.raw);
  if (q->peer_global && !to_g1 && memcmp(q->peer_dgid, g0.raw, sizeof g0.raw))
    return 0; /* a route header for another port's GID */
  uint32_t mine = G.subnet_set ? G.subnet : 0;
  uint32_t theirs = q->peer_subnet == SV_NO_SUBNET ? 0 : q->peer_subnet;
  if (mine == theirs) return 1; /* one subnet: by LID, or by FLID */
  return q->peer_global && to_g1 && q->peer_dlid == ib_flid(G.lid, dev, port);
}

/* Responder: whether the connection to q is one q's port accepts: the requester's ECE options
 * agree with q's (ece_agrees) and its subnet and address reach q's port
 * (subnet_agrees_locked), checked once q is past INIT as ece_agrees says. */
static int conn_agrees(struct sv_qp *q) {
  if (!ece_agrees(q)) return 0;
  pthread_mutex_lock(&q->mu);
  int ok = q->destroying || subnet_agrees_locked(q);
  pthread_mutex_unlock(&q->mu);
  return ok;
}

static void *in_reader(void *arg) {
  struct sv_qp *q = arg;
  int fd = q->in_fd;
  if (!conn_agrees(q)) { /* refused: the requester sees the connection end, as with no path */
    shutdown(fd, SHUT_RDWR);
    return NULL; /* the fd stays q->in_fd (closed with the QP): no other requester is let in */
  }
  char *bounce = malloc(SV_BOUNCE);
  for (;;) {
    if (!bounce) break;
    struct sv_req rq;
    if (readn(fd, &rq, sizeof rq)) break;
    uint64_t payload = (rq.op == SV_OP_READ) ? 0 : rq.len;
    int need_recv = rq.op == SV_OP_WRITE_IMM || rq.op == SV_OP_SEND || rq.op == SV_OP_SEND_IMM;
    struct sv_recv rcv = {0};
    if (resp_wait(q, need_recv, &rcv)) { /* in error: discard silently */
      if (drain(fd, payload)) break;
      continue;
    }
    if (rq.op == SV_OP_WRITE || rq.op == SV_OP_WRITE_IMM || rq.op == SV_OP_READ) {
      int need = rq.op == SV_OP_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
      char *dst = rq.len ? mr_check(rq.rkey, q->qp.pd, rq.raddr, rq.len, need) : (char *)"";
      if (!qp_allows(q, need)) dst = NULL; /* the QP itself does not grant this access */
      if (!dst) {
        if (drain(fd, payload)) break;
        if (need_recv) { /* the consumed receive is flushed with the QP */
          recv_cqe(q, rcv.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
        }
        respond(q, IBV_WC_REM_ACCESS_ERR, 0);
        resp_fail(q);
        continue;
      }
      if (rq.op == SV_OP_READ) {
        struct sv_rsp r = {IBV_WC_SUCCESS, 0, rq.len};
        struct iovec v[2] = {{&r, sizeof r}, {dst, (size_t)rq.len}};
        if (writev_all(fd, v, rq.len ? 2 : 1)) break;
        continue;
      }
      if (rq.len && read_ordered(fd, dst, rq.len, bounce)) break;
      count_rx(q, rq.len);
      if (rq.op == SV_OP_WRITE_IMM)
        recv_cqe(q, rcv.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, (uint32_t)rq.len, 1,
                 rq.imm);
      if (respond(q, IBV_WC_SUCCESS, 0)) break;
      continue;
    }
    if (rq.op == SV_OP_SEND || rq.op == SV_OP_SEND_IMM) {
      uint64_t room = 0;
      int bad = 0;
      for (int i = 0; i < rcv.num_sge; i++) {
        room += rcv.sge[i].length;
        if (rcv.sge[i].length && !mr_check(rcv.sge[i].lkey, q->qp.pd, rcv.sge[i].addr,
                                           rcv.sge[i].length, IBV_ACCESS_LOCAL_WRITE))
          bad = 1;
      }
      if (bad || room < rq.len) {
        if (drain(fd, rq.len)) break;
        recv_cqe(q, rcv.wr_id, bad ? IBV_WC_LOC_PROT_ERR : IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0,
                 0, 0);
        respond(q, IBV_WC_REM_INV_REQ_ERR, 0);
        resp_fail(q);
        continue;
      }
      uint64_t left = rq.len;
      int io_err = 0;
      for (int i = 0; i < rcv.num_sge && left && !io_err; i++) {
        uint64_t k = rcv.sge[i].length < left ? rcv.sge[i].length : left;
        char *p = mr_check(rcv.sge[i].lkey, q->qp.pd, rcv.sge[i].addr, k, 0);
        if (read_ordered(fd, p, k, bounce)) io_err = 1;
        left -= k;
      }
      if (io_err) break;
      count_rx(q, rq.len);
      recv_cqe(q, rcv.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, (uint32_t)rq.len,
               rq.op == SV_OP_SEND_IMM, rq.imm);
      if (respond(q, IBV_WC_SUCCESS, 0)) break;
      continue;
    }
    /* unknown opcode */
    drain(fd, payload);
    respond(q, IBV_WC_REM_INV_REQ_ERR, 0);
    resp_fail(q);
  }
  free(bounce);
  return NULL;
}

/* Accepts connections from peer QPs and hands each to the QP it names. */
static void *listener(void *arg) {
  (void)arg;
  for (;;) {
    int fd = accept4(G.listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return NULL;
    }
    struct sv_hello h;
    uint32_t ok = 0;
    if (readn(fd, &h, sizeof h) == 0 && h.magic == SV_HELLO_MAGIC) {
      pthread_mutex_lock(&G.mu);
      struct sv_qp *q = NULL;
      if ((h.dst_qpn >> 10) == G.lid) q = G.qps[h.dst_qpn & (SV_MAX_QP_PER_PROC - 1)];
      if (q) {
        pthread_mutex_lock(&q->mu);
        if (q->in_fd < 0 && !q->destroying) {
          q->in_fd = fd;
          q->peer_ece = h.ece; /* compared by in_reader once q's own options are final */
          q->peer_subnet = h.subnet; /* and these once q's port is set */
          q->peer_global = h.global != 0;
          q->peer_dlid = (uint16_t)h.dlid;
          memcpy(q->peer_dgid, h.dgid, sizeof q->peer_dgid);
          if (pthread_create(&q->in_thread, NULL, in_reader, q) == 0) {
            q->in_started = 1;
            ok = 1;
          } else {
            q->in_fd = -1;
          }
        }
        pthread_mutex_unlock(&q->mu);
      }
      pthread_mutex_unlock(&G.mu);
    }
    /* Once handed over the fd is the QP's, even when the answer cannot be sent (its in_reader
     * may have refused the connection already): only a refused hello's fd is closed here. */
    (void)write_all(fd, &ok, sizeof ok);
    if (!ok) close(fd);
  }
}

static void *port_down_timer(void *arg) {
  long ms = (long)(intptr_t)arg;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {}
  pthread_mutex_lock(&G.mu);
  G.port_down = 1;
  for (int i = 0; i < 64; i++) {
    struct sv_context *c = G.ctxs[i];
    if (!c) continue;
    for (int p = 1; p <= G.ports; p++) {
      struct ibv_async_event ev;
      memset(&ev, 0, sizeof ev);
      ev.event_type = IBV_EVENT_PORT_ERR;
      ev.element.port_num = p;
      if (write(c->async_pipe[1], &ev, sizeof ev) != (ssize_t)sizeof ev) {}
    }
  }
  pthread_mutex_unlock(&G.mu);
  return NULL;
}

/* Caller holds G.mu. Claims a LID and starts the listener. */
static int engine_init_locked(void) {
  if (G.initialized) return 0;
  G.ports = env_int("SOFT_VERBS_PORTS", 1) == 2 ? 2 : 1;
  G.rate_gbps = env_int("SOFT_VERBS_RATE_GBPS", 100);
  if (G.rate_gbps <= 0) G.rate_gbps = 100;
  const char *ll = getenv("SOFT_VERBS_LINK_LAYER");
  G.eth = ll && !strcmp(ll, "eth");
  const char *ece = getenv("SOFT_VERBS_ECE");
  G.ece_mask = ece && *ece ? (uint32_t)strtoul(ece, NULL, 0) : 0;
  const char *subnet = getenv("SOFT_VERBS_IB_SUBNET");
  G.subnet_set = subnet && !G.eth && parse_u16(subnet, &G.subnet); /* IB ports only */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  /* A process with a subnet takes a LID its ports' FLIDs can carry (ib_flid). */
  int lid_max = G.subnet_set ? SV_FLID_LID_MAX : SV_LID_MAX;
  uint16_t start = (uint16_t)(getpid() % lid_max) + 1;
  int bound = 0;
  for (int i = 0; i < lid_max && !bound; i++) {
    uint16_t lid = (uint16_t)((start - 1 + i) % lid_max + 1);
    struct sockaddr_un a;
    socklen_t len;
    lid_sockaddr(lid, &a, &len);
    if (bind(fd, (struct sockaddr *)&a, len) == 0) {
      G.lid = lid;
      bound = 1;
    }
  }
  if (!bound || listen(fd, 128)) {
    close(fd);
    errno = EADDRINUSE;
    return -1;
  }
  G.listen_fd = fd;
  if (pthread_create(&G.listener, NULL, listener, NULL)) {
    close(fd);
    G.listen_fd = -1;
    return -1;
  }
  pthread_detach(G.listener);
  G.next_key = ((uint32_t)G.lid << 16) | 0x100;
  int down = env_int("SOFT_VERBS_PORT_DOWN_AFTER_MS", -1);
  if (down >= 0) {
    pthread_t t;
    if (pthread_create(&t, NULL, port_down_timer, (void *)(intptr_t)down) == 0)
      pthread_detach(t);
  }
  G.initialized = 1;
  return 0;
}

/* ---------------------------------------------------------------- devices */

/* The device a context or a device pointer is, or NULL. */
static struct sv_device *sv_dev(struct ibv_device *device) {
  for (int d = 0; d < g_ndevices; d++)
    if (device == &g_devices[d].dev) return &g_devices[d];
  return NULL;
}

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices) {
  pthread_mutex_lock(&G.mu);
  if (!g_ndevices) {
    int n = env_int("SOFT_VERBS_DEVICES", SV_DEFAULT_DEVICES);
    g_ndevices = n < 1 ? 1 : n > SV_MAX_DEVICES ? SV_MAX_DEVICES : n;
    for (int d = 0; d < g_ndevices; d++) {
      struct sv_device *v = &g_devices[d];
      v->dev.node_type = IBV_NODE_CA;
      v->dev.transport_type = IBV_TRANSPORT_IB;
      snprintf(v->dev.name, sizeof v->dev.name, "soft_%d", d);
      snprintf(v->dev.dev_name, sizeof v->dev.dev_name, "uverbs%d", d);
      snprintf(v->dev.dev_path, sizeof v->dev.dev_path, "/sys/class/infiniband_verbs/uverbs%d", d);
      snprintf(v->dev.ibdev_path, sizeof v->dev.ibdev_path, "/sys/class/infiniband/soft_%d", d);
      v->guid = SV_SYS_IMAGE_GUID + ((uint64_t)d << 8);
      v->index = d;
    }
  }
  int n = g_ndevices;
  pthread_mutex_unlock(&G.mu);
  struct ibv_device **l = calloc((size_t)n + 1, sizeof *l);
  if (!l) {
    errno = ENOMEM;
    return NULL;
  }
  for (int d = 0; d < n; d++) l[d] = &g_devices[d].dev;
  if (num_devices) *num_devices = n;
  return l;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device) {
  return device ? device->name : NULL;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device) {
  struct sv_device *v = sv_dev(device);
  return (__be64)htobe64(v ? v->guid : SV_SYS_IMAGE_GUID);
}

SV_EXPORT int ibv_get_device_index(struct ibv_device *device) {
  struct sv_device *v = sv_dev(device);
  return v ? v->index : -1;
}

/* Payload bytes RDMA writes and sends delivered to the memory of device `name` (a test
 * counter, not a verbs function); 0 for an unknown name. */
SV_EXPORT uint64_t soft_verbs_rx_bytes(const char *name) {
  for (int d = 0; d < g_ndevices; d++)
    if (name && !strcmp(name, g_devices[d].dev.name))
      return __atomic_load_n(&g_devices[d].rx_bytes, __ATOMIC_RELAXED);
  return 0;
}

/* What a QP of this process was set up with (a test query, not a verbs function): the traffic
 * class (0 unless global) and service level of its RTR address, its ECE wire options (the
 * accepted ones once set, else 0) and its max_inline_data. NULL out-pointers are skipped.
 * 0, or ENOENT when qp_num is not a QP of this process. */
SV_EXPORT int soft_verbs_qp_facts(uint32_t qp_num, uint32_t *traffic_class,
                                  uint32_t *service_level, uint32_t *ece_options,
                                  uint32_t *max_inline) {
  pthread_mutex_lock(&G.mu); /* held: the QP cannot be destroyed meanwhile */
  struct sv_qp *q = NULL;
  if (G.initialized && (qp_num >> 10) == G.lid)
    q = G.qps[qp_num & (SV_MAX_QP_PER_PROC - 1)];
  if (!q) {
    pthread_mutex_unlock(&G.mu);
    return ENOENT;
  }
  pthread_mutex_lock(&q->mu);
  if (traffic_class) *traffic_class = q->tc;
  if (service_level) *service_level = q->sl;
  if (ece_options) *ece_options = ece_wire_locked(q);
  if (max_inline) *max_inline = q->cap.max_inline_data;
  pthread_mutex_unlock(&q->mu);
  pthread_mutex_unlock(&G.mu);
  return 0;
}

static void count_rx(struct sv_qp *q, uint64_t n) {
  struct sv_device *v = sv_dev(q->qp.context->device);
  if (v) __atomic_fetch_add(&v->rx_bytes, n, __ATOMIC_RELAXED);
}

static int sv_query_port_ex(struct ibv_context *, uint8_t, struct ibv_port_attr *, size_t);
static int sv_post_send(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
static int sv_post_recv(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device) {
  if (!sv_dev(device)) {
    errno = ENODEV;
    return NULL;
  }
  struct sv_context *c = calloc(1, sizeof *c);
  if (!c) {
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_lock(&G.mu);
  int rc = engine_init_locked();
  int slot = -1;
  for (int i = 0; i < 64 && rc == 0; i++)
    if (!G.ctxs[i]) { slot = i; break; }
  if (rc || slot < 0 || pipe2(c->async_pipe, O_CLOEXEC)) {
    pthread_mutex_unlock(&G.mu);
    free(c);
    if (!errno) errno = ENOMEM;
    return NULL;
  }
  G.ctxs[slot] = c;
  pthread_mutex_unlock(&G.mu);
  struct ibv_context *ctx = &c->vctx.context;
  ctx->device = device;
  ctx->cmd_fd = -1;
  ctx->async_fd = c->async_pipe[0];
  ctx->num_comp_vectors = 1;
  pthread_mutex_init(&ctx->mutex, NULL);
  ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
  ctx->ops.poll_cq = sv_poll_cq;
  ctx->ops.req_notify_cq = sv_req_notify_cq;
  ctx->ops.post_send = sv_post_send;
  ctx->ops.post_recv = sv_post_recv;
  c->vctx.sz = sizeof(struct verbs_context);
  c->vctx.query_port = sv_query_port_ex;
  return ctx;
}

SV_EXPORT int ibv_close_device(struct ibv_context *context) {
  struct sv_context *c = sv_ctx(context);
  pthread_mutex_lock(&G.mu);
  for (int i = 0; i < 64; i++)
    if (G.ctxs[i] == c) G.ctxs[i] = NULL;
  pthread_mutex_unlock(&G.mu);
  close(c->async_pipe[0]);
  close(c->async_pipe[1]);
  pthread_mutex_destroy(&context->mutex);
  free(c);
  return 0;
}

SV_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a) {
  (void)context;
  memset(a, 0, sizeof *a);
  snprintf(a->fw_ver, sizeof a->fw_ver, "1.0.0");
  a->node_guid = ibv_get_device_guid(context->device);
  a->sys_image_guid = (__be64)htobe64(SV_SYS_IMAGE_GUID);
  a->max_mr_size = UINT64_MAX;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = 0x02c9;
  a->vendor_part_id = 0x5ef7;
  a->hw_ver = 1;
  a->max_qp = SV_MAX_QP_PER_PROC;
  a->max_qp_wr = SV_MAX_WR;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
  a->max_sge = SV_MAX_SGE;
  a->max_sge_rd = SV_MAX_SGE;
  a->max_cq = 65536;
  a->max_cqe = 4194303;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 20;
  a->max_qp_rd_atom = 16;
  a->max_qp_init_rd_atom = 16;
  a->max_res_rd_atom = 1 << 20;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = (uint8_t)(G.ports ? G.ports : (env_int("SOFT_VERBS_PORTS", 1) == 2 ? 2 : 1));
  return 0;
}

/* Rate = width x per-lane speed. Picks the fastest combination not above the configured rate
 * (or the slowest one). */
static void rate_to_width_speed(int gbps, uint8_t *width, uint8_t *speed) {
  static const struct { uint8_t speed; double lane; } speeds[] = {
      {1, 2.5}, {2, 5}, {4, 10}, {8, 10}, {16, 14}, {32, 25}, {64, 50}, {128, 100}};
  static const struct { uint8_t width; int lanes; } widths[] = {
      {1, 1}, {16, 2}, {2, 4}, {4, 8}, {8, 12}};
  double best = -1;
  *width = 1;
  *speed = 1;
  for (size_t s = 0; s < sizeof speeds / sizeof speeds[0]; s++)
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
      double r = speeds[s].lane * widths[w].lanes;
      /* prefer 4X among equal rates */
      if (r <= gbps && (r > best || (r == best && widths[w].width == 2))) {
        best = r;
        *width = widths[w].width;
        *speed = speeds[s].speed;
      }
    }
}

/* Port `port` of the device of `context`. The LID's upper bits tell the device's ports apart
 * (the stand-in routes by the low 14 bits: the process). */
static int fill_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *a) {
  struct sv_device *v = context ? sv_dev(context->device) : NULL;
  int dev = v ? v->index : 0;
  int ports = G.ports ? G.ports : 1;
  if (port < 1 || port > ports) return EINVAL;
  memset(a, 0, sizeof *a);
  a->state = G.port_down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = G.eth ? SV_ETH_GIDS : ib_gids();
  a->port_cap_flags = 0;
  a->max_msg_sz = 0x80000000u;
  a->pkey_tbl_len = 1;
  if (!G.eth) a->lid = (uint16_t)(G.lid + (port == 2 ? 0x4000 : 0) + ((dev & 1) ? 0x8000 : 0));
  a->sm_lid = G.eth ? 0 : 1;
  a->lmc = 0;
  a->max_vl_num = 1;
  a->sm_sl = 0;
  a->subnet_timeout = 18;
  a->phys_state = G.port_down ? 3 /* disabled */ : 5 /* LinkUp */;
  a->link_layer = G.eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  rate_to_width_speed(G.rate_gbps ? G.rate_gbps : 100, &a->active_width, &a->active_speed);
  return 0;
}

static int sv_query_port_ex(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr,
                            size_t len) {
  struct ibv_port_attr a;
  int rc = fill_port(context, port, &a);
  if (rc) return rc;
  memcpy(attr, &a, len < sizeof a ? len : sizeof a);
  return 0;
}

/* The exported (non-inline) entry point takes rdma-core's older, shorter layout: fill only
 * the fields up to `flags`, which that layout ends with. */
#undef ibv_query_port
SV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port,
                             struct _compat_ibv_port_attr *attr) {
  struct ibv_port_attr a;
  int rc = fill_port(context, port, &a);
  if (rc) return rc;
  memcpy(attr, &a, offsetof(struct ibv_port_attr, port_cap_flags2));
  return 0;
}

/* GID `index` of an Ethernet port: the process's LID, the device and the port, as a
 * link-local fe80::273:<dev>ff:fe<port>:<lid> (indexes 0 and 1) or an IPv4-mapped
 * ::ffff:10.<dev*4+port>.<lid> (indexes 2 and 3); even indexes are RoCE v1, odd ones v2.
 * The stand-in routes a QP to the process whose LID its destination GID carries. */
static void eth_gid(uint16_t lid, int dev, int port, int index, union ibv_gid *gid) {
  memset(gid, 0, sizeof *gid);
  if (index < 2) {
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
    gid->raw[8] = 0x02;
    gid->raw[9] = 0x73;
    gid->raw[10] = (uint8_t)dev;
    gid->raw[11] = 0xff;
    gid->raw[12] = 0xfe;
    gid->raw[13] = (uint8_t)port;
  } else {
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    gid->raw[12] = 10;
    gid->raw[13] = (uint8_t)(dev * 4 + port);
  }
  gid->raw[14] = (uint8_t)(lid >> 8);
  gid->raw[15] = (uint8_t)lid;
}

/* Whether `gid` is GID `index` of some Ethernet port of the stand-in (of any process); its
 * LID in *lid. */
static int eth_gid_route(const union ibv_gid *gid, int index, uint16_t *lid) {
  if (index < 0 || index >= SV_ETH_GIDS) return 0;
  uint16_t l = (uint16_t)(gid->raw[14] << 8 | gid->raw[15]);
  int dev = index < 2 ? gid->raw[10] : gid->raw[13] / 4;
  int port = index < 2 ? gid->raw[13] : gid->raw[13] % 4;
  union ibv_gid want;
  eth_gid(l, dev, port, index, &want);
  if (l < 1 || l > SV_LID_MAX || dev >= SV_MAX_DEVICES || port < 1 || port > 2 ||
      memcmp(&want, gid, sizeof want))
    return 0;
  *lid = l;
  return 1;
}

SV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port, int index,
                            union ibv_gid *gid) {
  if (port < 1 || port > (G.ports ? G.ports : 1) || index < 0 ||
      index >= (G.eth ? SV_ETH_GIDS : ib_gids()))
    return -1;
  struct sv_device *v = sv_dev(context->device);
  if (G.eth)
    eth_gid(G.lid, v ? v->index : 0, port, index, gid);
  else
    ib_gid(v ? v->index : 0, port, index, gid);
  return 0;
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
                                uint32_t gid_index, struct ibv_gid_entry *entry, uint32_t flags,
                                size_t entry_size) {
  if (flags || entry_size < sizeof *entry) return EINVAL;
  memset(entry, 0, sizeof *entry);
  if (port_num > 255 || gid_index > 255 ||
      ibv_query_gid(context, (uint8_t)port_num, (int)gid_index, &entry->gid))
    return ENODATA;
  entry->gid_index = gid_index;
  entry->port_num = port_num;
  entry->gid_type = !G.eth             ? IBV_GID_TYPE_IB
                    : (gid_index & 1) ? IBV_GID_TYPE_ROCE_V2
                                      : IBV_GID_TYPE_ROCE_V1;
  return 0;
}

SV_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port, int index,
                             __be16 *pkey) {
  (void)context;
  if (port < 1 || port > (G.ports ? G.ports : 1) || index != 0) return -1;
  *pkey = htons(0xffff);
  return 0;
}

SV_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port, __be16 pkey) {
  (void)context;
  if (port < 1 || port > (G.ports ? G.ports : 1)) return -EINVAL;
  return (ntohs(pkey) & 0x7fff) == 0x7fff ? 0 : -ENOENT;
}

/* ---------------------------------------------------------------- PD, MR */

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
  struct ibv_pd *pd = calloc(1, sizeof *pd);
  if (!pd) {
    errno = ENOMEM;
    return NULL;
  }
  static uint32_t next_handle = 1;
  pd->context = context;
  pd->handle = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
  return pd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
  pthread_mutex_lock(&G.mu);
  for (int i = 0; i < G.nmrs; i++)
    if (G.mrs[i]->mr.pd == pd) {
      pthread_mutex_unlock(&G.mu);
      return EBUSY;
    }
  pthread_mutex_unlock(&G.mu);
  free(pd);
  return 0;
}

/* Whether the process can read the byte at p: a write() of it into a pipe fails with EFAULT
 * when it is not mapped readable (GPU memory, an unmapped range), which is where a real
 * device's pinning of the pages fails too. Caller holds G.mu. */
static int readable_byte(const void *p) {
  static int pfd[2] = {-1, -1};
  if (pfd[0] < 0 && pipe2(pfd, O_CLOEXEC | O_NONBLOCK)) return 1; /* cannot tell: accept */
  if (write(pfd[1], p, 1) != 1) return errno != EFAULT;
  char c;
  if (read(pfd[0], &c, 1) != 1) {}
  return 1;
}

/* Caller holds G.mu: the first and last byte of [addr, addr+length) are host memory. */
static int host_memory(const void *addr, size_t length) {
  return !length || (readable_byte(addr) && readable_byte((const char *)addr + length - 1));
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                          uint64_t iova, unsigned int access) {
  /* The kernel's check: known bits only; remote write or atomic needs local write. Remote
   * atomic access is granted even though atomics are not emulated (as a device without them
   * does); on-demand paging is not supported. */
  int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
              IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_HUGETLB |
              IBV_ACCESS_RELAXED_ORDERING | IBV_ACCESS_OPTIONAL_RANGE;
  if (pd && (access & IBV_ACCESS_ON_DEMAND)) {
    errno = EOPNOTSUPP;
    return NULL;
  }
  if (!pd || (access & ~(unsigned)known) ||
      ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
       !(access & IBV_ACCESS_LOCAL_WRITE))) {
    errno = EINVAL;
    return NULL;
  }
  pthread_mutex_lock(&G.mu);
  int host = host_memory(addr, length);
  pthread_mutex_unlock(&G.mu);
  if (!host) { /* device memory needs a peer-memory driver, which this device has not */
    errno = EFAULT;
    return NULL;
  }
  struct sv_mr *m = calloc(1, sizeof *m);
  if (!m) {
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_lock(&G.mu);
  if (G.nmrs == G.capmrs) {
    int ncap = G.capmrs ? G.capmrs * 2 : 64;
    struct sv_mr **n = realloc(G.mrs, (size_t)ncap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&G.mu);
      free(m);
      errno = ENOMEM;
      return NULL;
    }
    G.mrs = n;
    G.capmrs = ncap;
  }
  uint32_t key = G.next_key++;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.handle = key;
  m->mr.lkey = key;
  m->mr.rkey = key;
  m->base = addr;
  m->iova = iova;
  m->len = length;
  m->access = (int)access;
  G.mrs[G.nmrs++] = m;
  pthread_mutex_unlock(&G.mu);
  return &m->mr;
}

#undef ibv_reg_mr_iova
SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
                                         uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

#undef ibv_reg_mr
SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, (uint64_t)(uintptr_t)addr, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                           uint64_t iova, int fd, int access) {
  (void)pd; (void)offset; (void)length; (void)iova; (void)fd; (void)access;
  errno = EOPNOTSUPP;
  return NULL;
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
  pthread_mutex_lock(&G.mu);
  for (int i = 0; i < G.nmrs; i++)
    if (&G.mrs[i]->mr == mr) {
      free(G.mrs[i]);
      G.mrs[i] = G.mrs[--G.nmrs];
      pthread_mutex_unlock(&G.mu);
      return 0;
    }
  pthread_mutex_unlock(&G.mu);
  return EINVAL;
}

/* ---------------------------------------------------------------- CQ, channels */

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                       struct ibv_comp_channel *channel, int comp_vector) {
  (void)comp_vector;
  if (cqe < 1 || channel) {
    errno = channel ? ENOSYS : EINVAL;
    return NULL;
  }
  struct sv_cq *c = calloc(1, sizeof *c);
  if (!c) {
    errno = ENOMEM;
    return NULL;
  }
  c->cap = cqe < 16 ? 16 : cqe;
  c->ring = calloc((size_t)c->cap, sizeof *c->ring);
  if (!c->ring) {
    free(c);
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  c->cq.context = context;
  c->cq.cq_context = cq_context;
  c->cq.cqe = cqe;
  pthread_mutex_init(&c->cq.mutex, NULL);
  pthread_cond_init(&c->cq.cond, NULL);
  return &c->cq;
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *cq) {
  struct sv_cq *c = (struct sv_cq *)cq;
  pthread_mutex_destroy(&c->mu);
  free(c->ring);
  free(c);
  return 0;
}

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context) {
  (void)context;
  errno = ENOSYS;
  return NULL;
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel) {
  (void)channel;
  return ENOSYS;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
                               void **cq_context) {
  (void)channel; (void)cq; (void)cq_context;
  errno = ENOSYS;
  return -1;
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {
  (void)cq;
  (void)nevents;
}

/* ---------------------------------------------------------------- async events */

SV_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event) {
  for (;;) {
    ssize_t r = read(context->async_fd, event, sizeof *event);
    if (r == (ssize_t)sizeof *event) return 0;
    if (r < 0 && errno == EINTR) continue;
    return -1;
  }
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) { (void)event; }

/* ---------------------------------------------------------------- QP */

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init) {
  if (!pd || !init || init->qp_type != IBV_QPT_RC || init->srq || !init->send_cq ||
      !init->recv_cq || init->cap.max_send_sge > SV_MAX_SGE ||
      init->cap.max_recv_sge > SV_MAX_SGE || init->cap.max_send_wr > SV_MAX_WR ||
      init->cap.max_recv_wr > SV_MAX_WR || init->cap.max_inline_data > SV_MAX_INLINE) {
    errno = (init && init->qp_type != IBV_QPT_RC) ? EOPNOTSUPP : EINVAL;
    return NULL;
  }
  struct sv_qp *q = calloc(1, sizeof *q);
  if (!q) {
    errno = ENOMEM;
    return NULL;
  }
  q->fifo_cap = init->cap.max_send_wr ? (int)init->cap.max_send_wr : 1;
  q->rq_cap = init->cap.max_recv_wr ? (int)init->cap.max_recv_wr : 1;
  q->fifo = calloc((size_t)q->fifo_cap, sizeof *q->fifo);
  q->rq = calloc((size_t)q->rq_cap, sizeof *q->rq);
  if (!q->fifo || !q->rq) {
    free(q->fifo);
    free(q->rq);
    free(q);
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cond, NULL);
  pthread_mutex_init(&q->send_mu, NULL);
  q->out_fd = -1;
  q->in_fd = -1;
  /* The QP gets exactly the caps asked for (max_inline_data included), so init->cap, which
   * providers overwrite with what the QP got, already reports them. */
  q->cap = init->cap;
  q->sq_sig_all = init->sq_sig_all;
  int fa = env_int("SOFT_VERBS_FAIL_AFTER", -1);
  const char *fail_dev = getenv("SOFT_VERBS_FAIL_DEVICE");
  if (fail_dev && *fail_dev && strcmp(fail_dev, pd->context->device->name)) fa = -1;
  q->fail_after = fa >= 0 ? (uint64_t)fa + 1 : 0;
  q->qp.context = pd->context;
  q->qp.qp_context = init->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = init->send_cq;
  q->qp.recv_cq = init->recv_cq;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q->qp.mutex, NULL);
  pthread_cond_init(&q->qp.cond, NULL);
  q->attr.qp_state = IBV_QPS_RESET;
  q->attr.cap = init->cap;
  pthread_mutex_lock(&G.mu);
  int idx = -1;
  for (int i = 1; i < SV_MAX_QP_PER_PROC; i++) /* index 0 unused: qpn never 0 or 1 */
    if (!G.qps[i]) { idx = i; break; }
  if (!G.initialized || idx < 0) {
    pthread_mutex_unlock(&G.mu);
    free(q->fifo);
    free(q->rq);
    free(q);
    errno = ENOMEM;
    return NULL;
  }
  q->index = idx;
  q->qp.qp_num = ((uint32_t)G.lid << 10) | (uint32_t)idx;
  q->qp.handle = q->qp.qp_num;
  G.qps[idx] = q;
  pthread_mutex_unlock(&G.mu);
  return &q->qp;
}

/* Connects the requester socket to the peer QP (dlid: a LID, or a FLID addressed as
 * flid_route says; on Ethernet the LID the dgid carries; dest_qp_num), telling it q's ECE
 * wire options `ece`, this process's subnet and how q addressed it. */
static int qp_connect(struct sv_qp *q, uint32_t ece) {
  const struct ibv_ah_attr *ah = &q->attr.ah_attr;
  uint16_t dlid = ah->dlid & SV_LID_MAX;
  if (G.eth && !eth_gid_route(&ah->grh.dgid, ah->grh.sgid_index, &dlid)) return -1;
  if (!G.eth) flid_route(ah, &dlid); /* a FLID: its process's LID */
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a;
  socklen_t len;
  lid_sockaddr(dlid, &a, &len);
  struct sv_hello h;
  memset(&h, 0, sizeof h);
  h.magic = SV_HELLO_MAGIC;
  h.dst_qpn = q->attr.dest_qp_num;
  h.src_qpn = q->qp.qp_num;
  h.src_lid = G.lid;
  h.ece = ece;
  h.subnet = G.subnet_set ? G.subnet : SV_NO_SUBNET;
  h.global = ah->is_global;
  h.dlid = ah->dlid;
  if (ah->is_global) memcpy(h.dgid, ah->grh.dgid.raw, sizeof h.dgid);
  uint32_t ok = 0;
  if (connect(fd, (struct sockaddr *)&a, len) || write_all(fd, &h, sizeof h) ||
      readn(fd, &ok, sizeof ok) || !ok) {
    close(fd);
    return -1;
  }
  q->out_fd = fd;
  if (pthread_create(&q->out_thread, NULL, out_reader, q)) {
    close(fd);
    q->out_fd = -1;
    return -1;
  }
  q->out_started = 1;
  return 0;
}

/* SOFT_VERBS_MODIFY_QP_BUSY: whether this call of ibv_modify_qp is one of the first N. */
static int sv_modify_qp_busy(void) {
  static int limit = -1;
  static int calls;
  int busy;
  pthread_mutex_lock(&G.mu);
  if (limit < 0) {
    const char *v = getenv("SOFT_VERBS_MODIFY_QP_BUSY");
    limit = v ? atoi(v) : 0;
    if (limit < 0) limit = 0;
  }
  busy = calls < limit;
  calls++;
  pthread_mutex_unlock(&G.mu);
  return busy;
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
  struct sv_qp *q = (struct sv_qp *)qp;
  if (sv_modify_qp_busy()) return ETIMEDOUT;
  pthread_mutex_lock(&q->mu);
  enum ibv_qp_state cur = q->qp.state;
  if (mask & IBV_QP_CUR_STATE) cur = attr->cur_qp_state;
  enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  int ok = 0;
  switch (next) { /* the RC transitions of the IB spec, minimal attribute checks */
  case IBV_QPS_RESET: ok = 1; break;
  case IBV_QPS_ERR: ok = 1; break;
  case IBV_QPS_INIT:
    ok = (cur == IBV_QPS_RESET &&
          (mask & (IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) ==
              (IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) ||
         cur == IBV_QPS_INIT;
    break;
  case IBV_QPS_RTR:
    ok = cur == IBV_QPS_INIT &&
         (mask & (IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) ==
             (IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    break;
  case IBV_QPS_RTS:
    ok = (cur == IBV_QPS_RTR &&
          (mask & (IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                   IBV_QP_MAX_QP_RD_ATOMIC)) ==
              (IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
               IBV_QP_MAX_QP_RD_ATOMIC)) ||
         cur == IBV_QPS_RTS;
    break;
  default: ok = 0; break;
  }
  /* On Ethernet (RoCE) there are no LIDs: the address must be global, from a valid source GID
   * index, to the peer port's GID at that index. */
  uint16_t route;
  if (ok && G.eth && (mask & IBV_QP_AV) &&
      (!attr->ah_attr.is_global || attr->ah_attr.grh.sgid_index >= SV_ETH_GIDS ||
       !eth_gid_route(&attr->ah_attr.grh.dgid, attr->ah_attr.grh.sgid_index, &route) ||
       ((mask & IBV_QP_DEST_QPN) && (attr->dest_qp_num >> 10) != route)))
    ok = 0;
  /* On InfiniBand where subnets are in play (this process has one, or the address is to a
   * FLID) a global address needs a source GID index the port has. */
  if (ok && !G.eth && (mask & IBV_QP_AV) && attr->ah_attr.is_global &&
      (G.subnet_set || flid_route(&attr->ah_attr, &route)) &&
      attr->ah_attr.grh.sgid_index >= ib_gids())
    ok = 0;
  if (!ok || ((mask & IBV_QP_PORT) && (attr->port_num < 1 || attr->port_num > G.ports)) ||
      ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index >= 1 /* pkey_tbl_len */)) {
    pthread_mutex_unlock(&q->mu);
    return EINVAL;
  }
  if (mask & IBV_QP_PKEY_INDEX) q->attr.pkey_index = attr->pkey_index;
  if (mask & IBV_QP_PORT) q->attr.port_num = attr->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) q->attr.qp_access_flags = attr->qp_access_flags;
  if (mask & IBV_QP_AV) q->attr.ah_attr = attr->ah_attr;
  if (mask & IBV_QP_PATH_MTU) q->attr.path_mtu = attr->path_mtu;
  if (mask & IBV_QP_DEST_QPN) q->attr.dest_qp_num = attr->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) q->attr.rq_psn = attr->rq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q->attr.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) q->attr.min_rnr_timer = attr->min_rnr_timer;
  if (mask & IBV_QP_SQ_PSN) q->attr.sq_psn = attr->sq_psn;
  if (mask & IBV_QP_TIMEOUT) q->attr.timeout = attr->timeout;
  if (mask & IBV_QP_RETRY_CNT) q->attr.retry_cnt = attr->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) q->attr.rnr_retry = attr->rnr_retry;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q->attr.max_rd_atomic = attr->max_rd_atomic;
  if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) { /* the path's service level and class */
    q->sl = attr->ah_attr.sl;
    q->tc = attr->ah_attr.is_global ? attr->ah_attr.grh.traffic_class : 0;
  }
  if (next == IBV_QPS_RTS && cur == IBV_QPS_RTR && q->out_fd < 0) {
    /* connect outside q->mu: the peer may be this process, whose listener takes locks */
    uint32_t ece = ece_wire_locked(q); /* final: ibv_set_ece is refused past INIT */
    pthread_mutex_unlock(&q->mu);
    int rc = qp_connect(q, ece);
    pthread_mutex_lock(&q->mu);
    (void)rc; /* no path: requests will complete with RETRY_EXC_ERR */
  }
  if (next == IBV_QPS_ERR) {
    qp_to_error_locked(q);
  } else {
    q->qp.state = next;
    q->attr.qp_state = next;
  }
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->mu);
  return 0;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                           struct ibv_qp_init_attr *init) {
  (void)mask;
  struct sv_qp *q = (struct sv_qp *)qp;
  pthread_mutex_lock(&q->mu);
  *attr = q->attr;
  attr->qp_state = q->qp.state;
  attr->cur_qp_state = q->qp.state;
  attr->cap = q->cap;
  if (init) {
    memset(init, 0, sizeof *init);
    init->qp_context = q->qp.qp_context;
    init->send_cq = q->qp.send_cq;
    init->recv_cq = q->qp.recv_cq;
    init->cap = q->cap;
    init->qp_type = IBV_QPT_RC;
    init->sq_sig_all = q->sq_sig_all;
  }
  pthread_mutex_unlock(&q->mu);
  return 0;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
  struct sv_qp *q = (struct sv_qp *)qp;
  pthread_mutex_lock(&G.mu);
  G.qps[q->index] = NULL; /* the listener no longer hands connections to it */
  pthread_mutex_unlock(&G.mu);
  pthread_mutex_lock(&q->mu);
  q->destroying = 1;
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->mu);
  if (q->out_fd >= 0) shutdown(q->out_fd, SHUT_RDWR);
  if (q->in_fd >= 0) shutdown(q->in_fd, SHUT_RDWR);
  if (q->out_started) pthread_join(q->out_thread, NULL);
  if (q->in_started) pthread_join(q->in_thread, NULL);
  if (q->out_fd >= 0) close(q->out_fd);
  if (q->in_fd >= 0) close(q->in_fd);
  free(q->fifo);
  free(q->rq);
  free(q);
  return 0;
}

/* ---------------------------------------------------------------- posting */

static int sge_total(const struct ibv_sge *s, int n, uint64_t *total) {
  uint64_t t = 0;
  for (int i = 0; i < n; i++) t += s[i].length;
  *total = t;
  return 0;
}

static int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  struct sv_qp *q = (struct sv_qp *)qp;
  int rc = 0;
  pthread_mutex_lock(&q->send_mu);
  for (; wr; wr = wr->next) {
    enum ibv_wc_opcode wcop;
    uint32_t op;
    switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE: op = SV_OP_WRITE; wcop = IBV_WC_RDMA_WRITE; break;
    case IBV_WR_RDMA_WRITE_WITH_IMM: op = SV_OP_WRITE_IMM; wcop = IBV_WC_RDMA_WRITE; break;
    case IBV_WR_SEND: op = SV_OP_SEND; wcop = IBV_WC_SEND; break;
    case IBV_WR_SEND_WITH_IMM: op = SV_OP_SEND_IMM; wcop = IBV_WC_SEND; break;
    case IBV_WR_RDMA_READ: op = SV_OP_READ; wcop = IBV_WC_RDMA_READ; break;
    default: rc = EINVAL; break;
    }
    if (rc || wr->num_sge < 0 || wr->num_sge > (int)q->cap.max_send_sge ||
        (wr->num_sge > SV_MAX_SGE)) {
      rc = EINVAL;
      break;
    }
    uint64_t total;
    sge_total(wr->sg_list, wr->num_sge, &total);
    int inl = (wr->send_flags & IBV_SEND_INLINE) && op != SV_OP_READ;
    if (inl && total > q->cap.max_inline_data) { /* more than the QP's inline room */
      rc = EINVAL;
      break;
    }
    /* local checks: every SGE must lie in a registered MR of this PD (inline data need not) */
    int local_status = 0;
    for (int i = 0; i < wr->num_sge && !inl; i++)
      if (wr->sg_list[i].length &&
          !mr_check(wr->sg_list[i].lkey, q->qp.pd, wr->sg_list[i].addr, wr->sg_list[i].length,
                    op == SV_OP_READ ? IBV_ACCESS_LOCAL_WRITE : 0))
        local_status = IBV_WC_LOC_PROT_ERR;
    pthread_mutex_lock(&q->mu);
    enum ibv_qp_state st = q->qp.state;
    if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) {
      pthread_mutex_unlock(&q->mu);
      rc = EINVAL;
      break;
    }
    if (q->fifo_count == q->fifo_cap) {
      pthread_mutex_unlock(&q->mu);
      rc = ENOMEM;
      break;
    }
    q->posted++;
    if (q->fail_after && q->posted >= q->fail_after) local_status = IBV_WC_RETRY_EXC_ERR;
    if ((q->out_fd < 0 || q->path_lost) && !local_status)
      local_status = IBV_WC_RETRY_EXC_ERR; /* no path */
    struct sv_pending *p = &q->fifo[(q->fifo_head + q->fifo_count) % q->fifo_cap];
    memset(p, 0, sizeof *p);
    p->wr_id = wr->wr_id;
    p->opcode = wcop;
    p->signaled = q->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    p->byte_len = (uint32_t)total;
    p->num_sge = wr->num_sge;
    if (wr->num_sge) memcpy(p->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *p->sge);
    if (st == IBV_QPS_ERR) { /* flushed at once: nothing outstanding in ERR */
      send_cqe(q, p, IBV_WC_WR_FLUSH_ERR);
      pthread_mutex_unlock(&q->mu);
      continue;
    }
    p->local_status = local_status;
    q->fifo_count++;
    if (local_status) { /* never goes on the wire; completes in order */
      settle_head_locked(q);
      pthread_mutex_unlock(&q->mu);
      continue;
    }
    pthread_mutex_unlock(&q->mu);
    struct sv_req r = {op, (uint32_t)wr->imm_data, wr->wr.rdma.remote_addr, wr->wr.rdma.rkey, 0,
                       total};
    if (op == SV_OP_SEND || op == SV_OP_SEND_IMM) r.raddr = 0, r.rkey = 0;
    struct iovec v[1 + SV_MAX_SGE];
    int n = 0;
    v[n++] = (struct iovec){&r, sizeof r};
    if (op != SV_OP_READ)
      for (int i = 0; i < wr->num_sge; i++)
        if (wr->sg_list[i].length)
          v[n++] = (struct iovec){(void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length};
    if (writev_all(q->out_fd, v, n)) {
      /* the peer is gone: out_reader sees EOF and fails what is outstanding */
    }
  }
  pthread_mutex_unlock(&q->send_mu);
  if (rc && bad) *bad = wr;
  return rc;
}

static int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  struct sv_qp *q = (struct sv_qp *)qp;
  int rc = 0;
  pthread_mutex_lock(&q->mu);
  for (; wr; wr = wr->next) {
    if (wr->num_sge < 0 || wr->num_sge > (int)q->cap.max_recv_sge || q->qp.state == IBV_QPS_RESET) {
      rc = EINVAL;
      break;
    }
    if (q->qp.state == IBV_QPS_ERR) {
      recv_cqe(q, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
      continue;
    }
    if (q->rq_count == q->rq_cap) {
      rc = ENOMEM;
      break;
    }
    struct sv_recv *r = &q->rq[(q->rq_head + q->rq_count) % q->rq_cap];
    r->wr_id = wr->wr_id;
    r->num_sge = wr->num_sge;
    if (wr->num_sge) memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *r->sge);
    q->rq_count++;
  }
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->mu);
  if (rc && bad) *bad = wr;
  return rc;
}

/* ---------------------------------------------------------------- misc exported helpers */

SV_EXPORT int ibv_fork_init(void) { return 0; }

SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_DISABLED; }

/* ECE as mlx5 does it (see the header comment); without SOFT_VERBS_ECE the device has none. */
SV_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
  struct sv_qp *q = (struct sv_qp *)qp;
  if (!G.ece_mask) return EOPNOTSUPP;
  if (!ece) return EINVAL;
  pthread_mutex_lock(&q->mu);
  ece->vendor_id = SV_ECE_VENDOR;
  ece->options = q->ece_set ? q->ece_accepted : G.ece_mask; /* accepted, else the offer */
  ece->comp_mask = 0;
  pthread_mutex_unlock(&q->mu);
  return 0;
}

SV_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
  struct sv_qp *q = (struct sv_qp *)qp;
  if (!G.ece_mask) return EOPNOTSUPP;
  if (!ece || ece->vendor_id != SV_ECE_VENDOR || ece->comp_mask) {
    errno = EINVAL;
    return EINVAL;
  }
  int rc = 0;
  pthread_mutex_lock(&q->mu);
  if (q->qp.state == IBV_QPS_RESET || q->qp.state == IBV_QPS_INIT) { /* before RTR only */
    q->ece_accepted = ece->options & G.ece_mask; /* what this device supports of the request */
    q->ece_set = 1;
  } else {
    rc = EINVAL;
  }
  pthread_mutex_unlock(&q->mu);
  if (rc) errno = rc;
  return rc;
}

SV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op,
                                         uint32_t flags) {
  (void)qp;
  (void)op;
  (void)flags;
  return 1; /* data lands in order: the responder writes a request's payload before the next */
}

SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status) {
  static const char *const s[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error",
      "remote access error", "remote operation error", "transport retry counter exceeded",
      "RNR retry counter exceeded", "local RDD violation error", "remote invalid RD request",
      "aborted error", "invalid EE context number", "invalid EE context state",
      "fatal error", "response timeout error", "general error", "TM error", "TM rendezvous error"};
  if ((unsigned)status < sizeof s / sizeof s[0]) return s[status];
  return "unknown";
}

SV_EXPORT const char *ibv_port_state_str(enum ibv_port_state state) {
  static const char *const s[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED",
                                  "PORT_ACTIVE", "PORT_ACTIVE_DEFER"};
  if ((unsigned)state < sizeof s / sizeof s[0]) return s[state];
  return "unknown";
}

SV_EXPORT const char *ibv_node_type_str(enum ibv_node_type t) {
  switch (t) {
  case IBV_NODE_CA: return "InfiniBand channel adapter";
  case IBV_NODE_SWITCH: return "InfiniBand switch";
  case IBV_NODE_ROUTER: return "InfiniBand router";
  case IBV_NODE_RNIC: return "iWARP NIC";
  default: return "unknown";
  }
}

SV_EXPORT const char *ibv_event_type_str(enum ibv_event_type e) {
  static const char *const s[] = {
      "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
      "local access violation work queue error", "communication established",
      "send queue drained", "path migrated", "path migration request error", "local catastrophic error",
      "port active", "port error", "LID change", "P_Key change", "SM change",
      "SRQ catastrophic error", "SRQ limit reached", "last WQE reached", "client reregistration",
      "GID table change", "WQ fatal"};
  if ((unsigned)e < sizeof s / sizeof s[0]) return s[e];
  return "unknown";
}
