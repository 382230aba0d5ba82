// SPDX-License-Identifier: GPL-2.0
/*
 * hcl_style: a C++ client that registers peerdirect exports the way Habana's HCL registers
 * device memory with libfabric, and moves data over tcp with them.
 *
 * HCL hands libfabric a dma-buf as `struct fi_mr_dmabuf { fd, offset = 0, len,
 * base_addr = the buffer's address }` with `iov_count = 1` and `FI_MR_DMABUF`, and posts
 * operations at buffer addresses. Here the buffers are HBM allocations of /dev/peerdirect0,
 * exported read-write through the C ABI (pd_alloc, pd_export) and mapped into the process, so
 * the buffer address is the mapping's. Two RDM endpoints of libfabric's tcp provider exchange
 * 4 MiB HBM to HBM in 1 MiB tagged messages; the receiver's HBM is checked through its
 * mapping. Exit status 0 iff all of it worked.
 *
 *   c++ -std=c++17 -o hcl_style hcl_style.cpp $(pkg-config --cflags --libs peerdirect libfabric)
 */
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <peerdirect.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

namespace {

constexpr uint64_t kLength = 4u << 20;
constexpr size_t kChunk = 1u << 20;
constexpr uint64_t kTag = 0x4c43'0000;

[[noreturn]] void fail(const std::string &what, int err)
{
	throw std::runtime_error(what + ": " + fi_strerror(err < 0 ? -err : err) + " (" +
				 std::to_string(err) + ")");
}

void check(const std::string &what, long ret)
{
	if (ret < 0)
		fail(what, static_cast<int>(ret));
}

[[noreturn]] void pd_fail(const std::string &what, int err)
{
	throw std::runtime_error(what + ": " + pd_strerror(err) + " (" + pd_last_error() + ")");
}

// Closes any libfabric object.
struct FidCloser {
	void operator()(fid *f) const
	{
		if (f)
			fi_close(f);
	}
};
template <typename T> struct Fid {
	std::unique_ptr<fid, FidCloser> owner;
	T *ptr = nullptr;
	void adopt(T *p, fid *f)
	{
		ptr = p;
		owner.reset(f);
	}
};

// An HBM allocation, its read-write dma-buf and the dma-buf's mapping: the buffer.
class HbmBuffer {
public:
	HbmBuffer(pd_device *dev, uint64_t length) : length_(length)
	{
		int err = pd_alloc(dev, length, 0, &alloc_);
		if (err)
			pd_fail("pd_alloc", err);
		err = pd_export(alloc_, 0, 0, PD_EXPORT_CLOEXEC | PD_EXPORT_RDWR, &fd_);
		if (err)
			pd_fail("pd_export", err);
		void *addr = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
		if (addr == MAP_FAILED)
			throw std::runtime_error(std::string("mmap of the dma-buf: ") + strerror(errno));
		addr_ = static_cast<uint8_t *>(addr);
	}
	~HbmBuffer()
	{
		if (addr_)
			munmap(addr_, length_);
		if (fd_ >= 0)
			close(fd_);
		pd_allocation_free(alloc_);
	}
	HbmBuffer(const HbmBuffer &) = delete;
	HbmBuffer &operator=(const HbmBuffer &) = delete;

	int fd() const { return fd_; }
	uint8_t *data() const { return addr_; }
	uint64_t length() const { return length_; }
	uint64_t hbm_offset() const { return pd_allocation_hbm_offset(alloc_); }

private:
	uint64_t length_;
	pd_allocation *alloc_ = nullptr;
	int fd_ = -1;
	uint8_t *addr_ = nullptr;
};

// HCL's registration: the dma-buf fd, offset 0, base_addr = the buffer's address, one iov.
Fid<fid_mr> register_like_hcl(fid_domain *domain, const HbmBuffer &buffer, uint64_t access,
			      uint64_t key)
{
	fi_mr_dmabuf dmabuf{};
	dmabuf.fd = buffer.fd();
	dmabuf.offset = 0;
	dmabuf.len = buffer.length();
	dmabuf.base_addr = buffer.data();
	fi_mr_attr attr{};
	attr.dmabuf = &dmabuf;
	attr.iov_count = 1;
	attr.access = access;
	attr.requested_key = key;
	attr.iface = FI_HMEM_SYSTEM;
	fid_mr *mr = nullptr;
	check("fi_mr_regattr(FI_MR_DMABUF)", fi_mr_regattr(domain, &attr, FI_MR_DMABUF, &mr));
	Fid<fid_mr> out;
	out.adopt(mr, &mr->fid);
	return out;
}

// Reads `cq` once (which also drives tcp's progress): how many operations completed.
size_t reap(fid_cq *cq)
{
	fi_cq_tagged_entry entries[8];
	ssize_t n = fi_cq_read(cq, entries, 8);
	if (n == -FI_EAGAIN)
		return 0;
	if (n == -FI_EAVAIL) {
		fi_cq_err_entry err{};
		fi_cq_readerr(cq, &err, 0);
		fail("completion", -err.err);
	}
	check("fi_cq_read", n);
	return static_cast<size_t>(n);
}

uint8_t pattern(uint64_t i)
{
	return static_cast<uint8_t>((i * 0x9e3779b97f4a7c15ull) >> 56);
}

int run()
{
	// libfabric: tcp, as HCL's host-NIC path opens it (RDM, tagged, thread safe).
	fi_info *hints = fi_allocinfo();
	if (!hints)
		throw std::runtime_error("fi_allocinfo");
	hints->fabric_attr->prov_name = strdup("tcp");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	fi_info *raw_info = nullptr;
	int ret = fi_getinfo(FI_VERSION(1, 20), "127.0.0.1", nullptr, FI_SOURCE, hints, &raw_info);
	fi_freeinfo(hints);
	check("fi_getinfo(tcp)", ret);
	std::unique_ptr<fi_info, void (*)(fi_info *)> info(raw_info, fi_freeinfo);

	Fid<fid_fabric> fabric;
	fid_fabric *f = nullptr;
	check("fi_fabric", fi_fabric(info->fabric_attr, &f, nullptr));
	fabric.adopt(f, &f->fid);
	Fid<fid_domain> domain;
	fid_domain *d = nullptr;
	check("fi_domain", fi_domain(fabric.ptr, info.get(), &d, nullptr));
	domain.adopt(d, &d->fid);

	// Memory first, so that it is deregistered (and unmapped) after the endpoints close.
	int err = 0;
	std::unique_ptr<pd_device, void (*)(pd_device *)> dev(pd_device_open(0, &err),
							      pd_device_close);
	if (!dev)
		pd_fail("pd_device_open(0)", err);
	HbmBuffer source(dev.get(), kLength), destination(dev.get(), kLength);
	for (uint64_t i = 0; i < kLength; i++) {
		source.data()[i] = pattern(i);
		destination.data()[i] = 0;
	}
	Fid<fid_mr> src_mr = register_like_hcl(domain.ptr, source, FI_SEND, 1);
	Fid<fid_mr> dst_mr = register_like_hcl(domain.ptr, destination, FI_RECV, 2);
	std::printf("registered 2 peerdirect exports like HCL (fi_mr_dmabuf: fd, offset 0, base_addr "
		    "= buffer, iov_count 1): keys %#" PRIx64 " and %#" PRIx64 "\n",
		    fi_mr_key(src_mr.ptr), fi_mr_key(dst_mr.ptr));

	// Two endpoints, each with its CQ and address vector.
	struct Endpoint {
		Fid<fid_cq> cq;
		Fid<fid_av> av;
		Fid<fid_ep> ep;
	};
	std::vector<Endpoint> eps(2);
	for (Endpoint &e : eps) {
		fi_cq_attr cq_attr{};
		cq_attr.format = FI_CQ_FORMAT_TAGGED;
		cq_attr.size = 64;
		fid_cq *cq = nullptr;
		check("fi_cq_open", fi_cq_open(domain.ptr, &cq_attr, &cq, nullptr));
		e.cq.adopt(cq, &cq->fid);
		fi_av_attr av_attr{};
		av_attr.type = FI_AV_TABLE;
		fid_av *av = nullptr;
		check("fi_av_open", fi_av_open(domain.ptr, &av_attr, &av, nullptr));
		e.av.adopt(av, &av->fid);
		fid_ep *ep = nullptr;
		check("fi_endpoint", fi_endpoint(domain.ptr, info.get(), &ep, nullptr));
		e.ep.adopt(ep, &ep->fid);
		check("fi_ep_bind(cq)", fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
		check("fi_ep_bind(av)", fi_ep_bind(ep, &av->fid, 0));
		check("fi_enable", fi_enable(ep));
	}
	char name[256];
	size_t name_len = sizeof(name);
	check("fi_getname", fi_getname(&eps[1].ep.ptr->fid, name, &name_len));
	fi_addr_t receiver = 0;
	if (fi_av_insert(eps[0].av.ptr, name, 1, &receiver, 0, nullptr) != 1)
		throw std::runtime_error("fi_av_insert of the receiver");

	// Receives first, then the sends: one tagged message per 1 MiB, at buffer addresses.
	const size_t chunks = kLength / kChunk;
	for (size_t i = 0; i < chunks; i++)
		check("fi_trecv", fi_trecv(eps[1].ep.ptr, destination.data() + i * kChunk, kChunk,
					   fi_mr_desc(dst_mr.ptr), FI_ADDR_UNSPEC, kTag + i, 0,
					   nullptr));
	size_t sent = 0, received = 0;
	for (size_t i = 0; i < chunks; i++) {
		ssize_t ret;
		while ((ret = fi_tsend(eps[0].ep.ptr, source.data() + i * kChunk, kChunk,
				       fi_mr_desc(src_mr.ptr), receiver, kTag + i, nullptr)) ==
		       -FI_EAGAIN) {
			sent += reap(eps[0].cq.ptr);
			received += reap(eps[1].cq.ptr);
		}
		check("fi_tsend", ret);
	}
	while (sent < chunks || received < chunks) {
		sent += reap(eps[0].cq.ptr);
		received += reap(eps[1].cq.ptr);
	}

	for (uint64_t i = 0; i < kLength; i++) {
		if (destination.data()[i] != pattern(i)) {
			std::fprintf(stderr, "hcl_style: the receiver's HBM differs at byte %#" PRIx64 "\n",
				     i);
			return 1;
		}
	}
	std::printf("moved %" PRIu64 " bytes HBM to HBM over tcp in %zu tagged messages; the "
		    "receiver's HBM (offset %#" PRIx64 ") holds the sender's bytes\n",
		    kLength, chunks, destination.hbm_offset());
	// Endpoints close before the registrations and the memory (reverse order of the locals).
	eps.clear();
	return 0;
}

} // namespace

int main()
{
	try {
		return run();
	} catch (const std::exception &e) {
		std::fprintf(stderr, "hcl_style: %s\n", e.what());
		return 1;
	}
}
