"""Packet-level completion times of cross-host collectives with ns-3 (optional: ``pip install
dmt[sim]``, the ``ns3`` package from PyPI), to cross-check the alpha-beta model of
:mod:`dmt.planning.network`.

Topology (full bisection): ``H`` hosts, each with one NIC, a point-to-point link of
``rate_gbit`` Gbit/s and ``delay_us`` one-way delay to a central switch node that forwards IP
between its ports with no internal limit (non-blocking: only a NIC or a switch port toward a host
can be a bottleneck). Every host pair that exchanges data holds one persistent TCP connection
(as gloo and NCCL keep theirs), opened before the timed traffic starts; IP, TCP and the link
headers are on the wire (``mtu - 52`` payload bytes per MTU-sized packet plus the 2-byte PPP
header),
and the queues are ns-3's defaults (FqCoDel root queue disc, 100-packet device queues).

A workload is a list of *phases*, each a list of ``(src, dst, bytes)`` transfers that start
together; a phase starts when every transfer of the previous one has been received in full, so a
ring all-reduce runs step by step, each step waiting for the previous as the real one does:

* :func:`all_to_all_s`: one phase, every host sends ``M`` bytes to every other host;
* :func:`ring_all_reduce_s`: ``2 (H - 1)`` phases (reduce-scatter, then all-gather), in each
  host ``h`` sends one ``S / H`` chunk to ``h + 1``.

The simulation itself is C++ compiled once per process by cppyy (what the ``ns3`` wheel's Python
bindings are built on); importing ``ns3`` takes tens of seconds, one simulation of up to ~10^5
packets a few seconds.

Shape legend: ``H`` hosts, ``M`` bytes per host pair, ``S`` all-reduce buffer bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_CXX = r"""
#include "ns3/core-module.h"
#include "ns3/network-module.h"
#include "ns3/internet-module.h"
#include "ns3/point-to-point-module.h"
#include <map>
#include <vector>

namespace dmt_ns3 {
using namespace ns3;

struct Flow {
    Ptr<Socket> tx;
    uint64_t pending = 0;   // bytes still to hand to the sender socket
    uint64_t received = 0;  // bytes the receiver has read so far
    uint64_t target = 0;    // received bytes that complete the current phase
    bool waiting = false;   // part of the running phase and not complete yet
    bool connected = false;
};

class PhasedRun {
  public:
    PhasedRun(uint32_t hosts, const std::vector<int>& phase, const std::vector<int>& src,
              const std::vector<int>& dst, const std::vector<double>& bytes)
        : m_hosts(hosts), m_phase(phase), m_src(src), m_dst(dst), m_bytes(bytes) {
        for (int p : phase) m_numPhases = std::max(m_numPhases, p + 1);
    }

    std::vector<double> Run(double rateGbit, double delayUs, uint32_t mtu, double startS,
                            double limitS) {
        // MTU less the IPv4 (20), TCP (20) and TCP timestamp option (12) headers
        Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(mtu - 52));
        Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(1 << 23));
        Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(1 << 23));
        Config::SetDefault("ns3::TcpSocket::InitialCwnd", UintegerValue(10));

        NodeContainer hosts;
        hosts.Create(m_hosts);
        Ptr<Node> sw = CreateObject<Node>();
        InternetStackHelper stack;
        stack.Install(hosts);
        stack.Install(sw);
        PointToPointHelper link;
        std::ostringstream rate;
        rate << rateGbit << "Gbps";
        link.SetDeviceAttribute("DataRate", StringValue(rate.str()));
        link.SetChannelAttribute("Delay", TimeValue(NanoSeconds(int64_t(delayUs * 1e3))));
        link.SetDeviceAttribute("Mtu", UintegerValue(mtu));
        Ipv4AddressHelper address;
        std::vector<Ipv4Address> ip(m_hosts);
        for (uint32_t h = 0; h < m_hosts; ++h) {
            NetDeviceContainer pair = link.Install(hosts.Get(h), sw);
            std::ostringstream net;
            net << "10." << (h / 250) << "." << (h % 250) << ".0";
            address.SetBase(net.str().c_str(), "255.255.255.0");
            ip[h] = address.Assign(pair).GetAddress(0);
            m_hostOfIp[ip[h].Get()] = h;
        }
        Ipv4GlobalRoutingHelper::PopulateRoutingTables();

        m_nodes = hosts;
        m_ip = ip;
        // sockets only once the nodes are initialised (their traffic-control layers set up)
        Simulator::Schedule(Seconds(0), &PhasedRun::OpenConnections, this);
        m_ends.assign(m_numPhases, -1.0);
        Simulator::Schedule(Seconds(startS), &PhasedRun::StartPhase, this, 0);
        Simulator::Stop(Seconds(startS + limitS));
        Simulator::Run();
        Simulator::Destroy();
        std::vector<double> out;
        for (double end : m_ends) out.push_back(end < 0 ? -1.0 : end - startS);
        return out;
    }

    bool AllConnected() const { return m_allConnected; }

  private:
    void OpenConnections() {
        for (uint32_t h = 0; h < m_hosts; ++h) {
            Ptr<Socket> sink = Socket::CreateSocket(m_nodes.Get(h), TcpSocketFactory::GetTypeId());
            sink->Bind(InetSocketAddress(Ipv4Address::GetAny(), 9000));
            sink->Listen();
            sink->SetAcceptCallback(MakeNullCallback<bool, Ptr<Socket>, const Address&>(),
                                    MakeCallback(&PhasedRun::Accepted, this));
        }
        for (size_t i = 0; i < m_src.size(); ++i) {
            uint64_t key = Key(m_src[i], m_dst[i]);
            if (m_flows.count(key)) continue;
            Flow& f = m_flows[key];
            f.tx = Socket::CreateSocket(m_nodes.Get(m_src[i]), TcpSocketFactory::GetTypeId());
            f.tx->Bind();
            f.tx->SetConnectCallback(MakeCallback(&PhasedRun::Connected, this),
                                     MakeCallback(&PhasedRun::Failed, this));
            f.tx->SetSendCallback(MakeCallback(&PhasedRun::SendSpace, this));
            f.tx->Connect(InetSocketAddress(m_ip[m_dst[i]], 9000));
            m_flowOfTx[PeekPointer(f.tx)] = key;
        }
    }

    static uint64_t Key(int src, int dst) { return (uint64_t(src) << 32) | uint32_t(dst); }

    void StartPhase(int k) {
        m_allConnected = true;
        for (auto& kv : m_flows) m_allConnected = m_allConnected && kv.second.connected;
        m_waiting = 0;
        for (size_t i = 0; i < m_phase.size(); ++i) {
            if (m_phase[i] != k) continue;
            Flow& f = m_flows[Key(m_src[i], m_dst[i])];
            uint64_t n = uint64_t(m_bytes[i]);
            f.pending += n;
            f.target += n;
            if (!f.waiting) ++m_waiting;
            f.waiting = true;
        }
        m_current = k;
        for (auto& kv : m_flows) Pump(kv.second);
        if (m_waiting == 0) EndPhase();
    }

    void EndPhase() {
        m_ends[m_current] = Simulator::Now().GetSeconds();
        if (m_current + 1 < m_numPhases) StartPhase(m_current + 1);
        else Simulator::Stop();
    }

    void Pump(Flow& f) {
        while (f.pending > 0 && f.connected) {
            uint32_t room = f.tx->GetTxAvailable();
            if (room == 0) break;
            uint32_t n = uint32_t(std::min<uint64_t>({f.pending, room, 1u << 16}));
            int sent = f.tx->Send(Create<Packet>(n));
            if (sent <= 0) break;
            f.pending -= uint64_t(sent);
        }
    }

    void Connected(Ptr<Socket> s) {
        Flow& f = m_flows[m_flowOfTx[PeekPointer(s)]];
        f.connected = true;
        Pump(f);
    }
    void Failed(Ptr<Socket>) { NS_FATAL_ERROR("dmt_ns3: a TCP connection failed"); }
    void SendSpace(Ptr<Socket> s, uint32_t) { Pump(m_flows[m_flowOfTx[PeekPointer(s)]]); }

    void Accepted(Ptr<Socket> s, const Address& from) {
        uint32_t src = m_hostOfIp[InetSocketAddress::ConvertFrom(from).GetIpv4().Get()];
        m_srcOfRx[PeekPointer(s)] = src;
        s->SetRecvCallback(MakeCallback(&PhasedRun::Received, this));
    }

    void Received(Ptr<Socket> s) {
        Ptr<Node> node = s->GetNode();
        uint32_t dst = m_hostOfIp[node->GetObject<Ipv4>()->GetAddress(1, 0).GetLocal().Get()];
        Flow& f = m_flows[Key(m_srcOfRx[PeekPointer(s)], dst)];
        Ptr<Packet> p;
        while ((p = s->Recv())) f.received += p->GetSize();
        if (f.waiting && f.received >= f.target) {
            f.waiting = false;
            if (--m_waiting == 0) EndPhase();
        }
    }

    uint32_t m_hosts;
    std::vector<int> m_phase, m_src, m_dst;
    std::vector<double> m_bytes;
    int m_numPhases = 0, m_current = -1, m_waiting = 0;
    bool m_allConnected = false;
    std::map<uint64_t, Flow> m_flows;
    std::map<Socket*, uint64_t> m_flowOfTx;
    std::map<Socket*, uint32_t> m_srcOfRx;
    std::map<uint32_t, uint32_t> m_hostOfIp;
    std::vector<double> m_ends;
    NodeContainer m_nodes;
    std::vector<Ipv4Address> m_ip;
};
}  // namespace dmt_ns3
"""

_compiled: Any = None


def _cxx() -> Any:
    """The compiled ``dmt_ns3`` namespace (imports ns-3 and compiles the C++ once per process)."""
    global _compiled
    if _compiled is None:
        try:
            from ns import ns  # noqa: F401  (loads the ns-3 libraries and their headers)
        except ImportError as e:
            raise ImportError(
                "dmt.planning.ns3_sim needs the ns3 package: pip install 'dmt[sim]' (or ns3)"
            ) from e
        import cppyy

        cppyy.cppdef(_CXX)
        _compiled = cppyy.gbl.dmt_ns3
    return _compiled


@dataclass(frozen=True)
class NetworkSpec:
    """The simulated network: one NIC link per host to a non-blocking switch."""

    rate_gbit: float = 10.0
    """Link rate, Gbit/s, per direction (host to switch and switch to host)."""
    delay_us: float = 1.0
    """One-way propagation delay of one link (a host-to-host path has two), microseconds."""
    mtu_bytes: int = 9000
    """IP MTU of every link (jumbo frames by default, as in training clusters; also 6x fewer
    packets to simulate than 1500). A TCP segment carries ``mtu_bytes - 52`` payload bytes."""

    @property
    def goodput_bytes_per_s(self) -> float:
        """Payload bytes per second one saturated link delivers: the rate less the IP, TCP
        (with timestamps) and PPP headers of full segments."""
        return self.rate_gbit * 1e9 / 8 * (self.mtu_bytes - 52) / (self.mtu_bytes + 2)

    def __post_init__(self) -> None:
        if not self.rate_gbit > 0:
            raise ValueError(f"NetworkSpec.rate_gbit={self.rate_gbit!r} must be > 0 (Gbit/s)")
        if not self.delay_us >= 0:
            raise ValueError(f"NetworkSpec.delay_us={self.delay_us!r} must be >= 0 (us)")
        if not 576 <= self.mtu_bytes <= 65535:
            raise ValueError(f"NetworkSpec.mtu_bytes={self.mtu_bytes!r} must be in 576..65535")


Transfer = tuple[int, int, int]
"""``(src host, dst host, bytes)``."""


def simulate_phases(
    hosts: int,
    phases: Sequence[Sequence[Transfer]],
    net: NetworkSpec,
    *,
    limit_s: float = 60.0,
) -> list[float]:
    """Simulated seconds from the start of the first phase to the end of each phase.

    Args:
        hosts: ``H``, number of hosts (2..250 * 250).
        phases: per phase, the transfers that start together when the previous phase ends; a
            host pair appears at most once per phase.
        net: link rate and delay.
        limit_s: simulated-time limit; a workload not done by then raises.

    Returns:
        ``ends``, one value per phase: ``ends[-1]`` is the completion time of the workload.
    """
    if hosts < 2:
        raise ValueError(f"hosts={hosts} must be >= 2 (a cross-host collective needs two hosts)")
    if not phases:
        raise ValueError("phases is empty: nothing to simulate")
    phase: list[int] = []
    src: list[int] = []
    dst: list[int] = []
    nbytes: list[float] = []
    for k, transfers in enumerate(phases):
        pairs = [(s, d) for s, d, _ in transfers]
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"phase {k} sends twice between one host pair: {sorted(pairs)}")
        for s, d, b in transfers:
            if not (0 <= s < hosts and 0 <= d < hosts) or s == d:
                raise ValueError(
                    f"phase {k}: transfer {s}->{d} must join two different hosts of 0..{hosts - 1}"
                )
            if b < 1:
                raise ValueError(f"phase {k}: transfer {s}->{d} of {b} bytes must be >= 1 byte")
            phase.append(k)
            src.append(s)
            dst.append(d)
            nbytes.append(float(b))
    sim = _cxx()
    run = sim.PhasedRun(hosts, phase, src, dst, nbytes)
    start_s = 0.01  # every connection's handshake is done long before
    ends = [float(x) for x in run.Run(net.rate_gbit, net.delay_us, net.mtu_bytes, start_s, limit_s)]
    if not run.AllConnected():
        raise RuntimeError("ns-3: not every TCP connection was established before the first phase")
    if min(ends) < 0:
        raise RuntimeError(
            f"ns-3: the workload did not finish within limit_s={limit_s} simulated seconds "
            f"(phase ends {ends})"
        )
    return ends


def all_to_all_s(hosts: int, bytes_per_pair: int, net: NetworkSpec) -> float:
    """Seconds until every host has received ``M = bytes_per_pair`` from every other host, all
    ``H (H - 1)`` transfers starting at once."""
    transfers = [(s, d, bytes_per_pair) for s in range(hosts) for d in range(hosts) if s != d]
    return simulate_phases(hosts, [transfers], net)[-1]


def ring_all_reduce_s(hosts: int, buffer_bytes: int, net: NetworkSpec) -> float:
    """Seconds of a ring all-reduce of ``S = buffer_bytes`` over ``H`` hosts: ``2 (H - 1)`` steps,
    each host sending one ``S / H`` chunk to its right neighbour, each step after the previous."""
    chunk = -(-buffer_bytes // hosts)
    step = [(h, (h + 1) % hosts, chunk) for h in range(hosts)]
    return simulate_phases(hosts, [step] * (2 * (hosts - 1)), net)[-1]
